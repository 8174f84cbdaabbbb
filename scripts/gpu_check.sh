#!/usr/bin/env bash
# torchrelay's GPU check: one prepared run on a machine with one NVIDIA GPU (issue 15, "GPU").
#
#   bash scripts/gpu_check.sh OUT_DIR
#
# Each step is timed, bounded (timeout) and goes on when an earlier one failed; everything
# printed is also in OUT_DIR/gpu_check.log, and each job's ledger and output are copied to
# OUT_DIR. The steps:
#   1. facts: nvidia-smi, the torch, CUDA and NCCL versions, the GPU torch sees, the CPUs;
#   2. the NVML tests against the real driver (CI skips them: it has no nvidia-ml-py);
#   3. NVML readings as torchrelay's health poller takes them;
#   4. recovery with CUDA state: examples/train_gpt.py, 2 workers and 1 spare sharing GPU 0
#      (TORCHRELAY_DEVICE=cuda:0, so gloo reduces the CUDA tensors: NCCL refuses two ranks on one
#      GPU), once failure-free and twice with rank 1 SIGKILLed in its backward pass and rank 0 in
#      its forward: with workers forked from the node's template, and with fresh interpreters
#      (--no-template); each run's final weights compared bit for bit with the failure-free
#      run's, the recoveries' timelines read from the ledger, and no warning in it (the
#      replicated-state check digests CUDA tensors on the GPU: runtime/replicas.block_sums);
#   5. the same with a larger model (GPU_CHECK_LARGE, "dim layers heads": 1024 8 16, about
#      0.1 G parameters, 1.3 GB of weights and optimizer state), one kill;
#   6. NCCL: the same script, one worker on GPU 0 with the non-blocking NCCL communicator (a
#      recovery between NCCL ranks needs a second GPU);
#   7. the exit holder (runtime/exit_holder.py) with a CUDA context, which it is not yet started
#      with by default: kill -> reaped and kill -> the GPU's memory free again, for a process
#      holding 1 GiB on the GPU and 1 GiB of host memory, with the holder and without; then
#      the 2-kill job again with TORCHRELAY_EXIT_HOLDER=1, its weights compared;
#   8. on the machine's CPUs (TORCHRELAY_DEVICE=cpu), docs/benchmarks.md's figures on a machine
#      with more than 2 cores: bench.stall --pairs 2 (the stall), bench.exit_floor (kill ->
#      reaped) and bench.xfer --mb 1000 (transfer efficiency against gloo's own broadcast).
# GPU_CHECK_CPU=1 runs steps 3-5, 7 and 8 on the CPU instead (TORCHRELAY_DEVICE=cpu, a small
# "large" model, one bench pair, 100 MB for bench.xfer) and skips 2 and 6: a dry run of this
# script without a GPU.
#
# On a machine without network access whose Python lacks torchdata, put its wheel in .whl/ of
# the checkout first (pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
# torchdata==0.11.0): it is installed from there into a scratch directory.
set -u
out=${1:?usage: bash scripts/gpu_check.sh OUT_DIR}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if compgen -G ".whl/*.whl" > /dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" \
        .whl/*.whl || exit 2
    export PYTHONPATH="$PWD/src:$PWD:$work/site"
else
    export PYTHONPATH="$PWD/src:$PWD"
fi
cpu=${GPU_CHECK_CPU:-0}
device=cuda:0
large=${GPU_CHECK_LARGE:-1024 8 16}
pairs=2 xfer_mb=1000
if [ "$cpu" = 1 ]; then
    device=cpu large="256 2 4" pairs=1 xfer_mb=100
fi
read -r dim layers heads <<< "$large"
exec > >(tee "$out/gpu_check.log") 2>&1
results=()

step() {  # step NAME COMMAND...: run, time, record the exit status
    local name=$1 start rc
    shift
    echo "=== $name"
    start=$(date +%s%N)
    "$@"
    rc=$?
    local ms=$((($(date +%s%N) - start) / 1000000))
    printf '=== %s: exit %s after %d.%01d s\n\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100))
    results+=("$name: exit $rc")
}

facts() {
    nvidia-smi || echo "(no nvidia-smi)"
    echo "cpus $(nproc --all), $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r)"
    "$py" - <<'EOF2'
import sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
    print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
    from torchrelay.transfer.buffers import free_bytes  # what a laggard's copy may take
    print("free bytes: cuda:0", free_bytes(torch.device("cuda:0")),
          "host", free_bytes(torch.device("cpu")))
EOF2
}

readings() {
    timeout -k 5 60 "$py" - <<'EOF2'
import json
from torchrelay.health.nvml import NvmlSource
source = NvmlSource("node0")
print("enabled", source.enabled)
for reading in source.read() if source.enabled else []:
    print(json.dumps(vars(reading), default=str))
source.close()
EOF2
}

cuda_holder() {  # kill -> reaped, and -> the device's memory free, with and without the holder
    TORCHRELAY_EXIT_HOLDER=1 timeout -k 5 300 "$py" - "$device" <<'EOF2'
import os, signal, subprocess, sys, time
import torch
device = torch.device(sys.argv[1])
child = """
import os, signal, sys, time, torch
from torchrelay.runtime import exit_holder
device = torch.device(sys.argv[1])
on_device = torch.ones(2**28, device=device)  # 1 GiB
host = torch.ones(2**28)  # 1 GiB written
if sys.argv[2] == "1":
    assert exit_holder.start() is not None, "no exit holder"
torch.cuda.synchronize() if device.type == "cuda" else None
print(time.time(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

def free() -> int:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0

if device.type == "cuda":
    torch.cuda.init()
for hold in ("0", "1", "0", "1"):
    before = free()
    proc = subprocess.Popen([sys.executable, "-c", child, str(device), hold], stdout=subprocess.PIPE)
    killed = float(proc.stdout.readline())
    proc.wait()
    reaped = time.time() - killed
    deadline = time.monotonic() + 60
    while device.type == "cuda" and free() < before - 2**26 and time.monotonic() < deadline:
        time.sleep(0.001)
    released = time.time() - killed
    back = free() >= before - 2**26
    print(f"holder={hold}: kill -> reaped {reaped * 1e3:.1f} ms, -> device memory free "
          f"{released * 1e3:.1f} ms ({'yes' if back else 'NOT FREED'})", flush=True)
    if not back:
        sys.exit(1)
EOF2
}

holder_job() {  # job ... with the exit holder on, CUDA or not
    TORCHRELAY_EXIT_HOLDER=1 job "$@"
}

job() {  # job NAME TORCHRELAY_DEVICE [RUN FLAGS...] -- [SCRIPT FLAGS...]: a train_gpt.py job
    local name=$1 dev=$2 rc flags=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    TORCHRELAY_DEVICE=$dev timeout -k 10 240 "$py" -m torchrelay.cli.main run \
        --run-dir "$work/$name" "${flags[@]}" src/torchrelay/examples/train_gpt.py \
        --out "$work/$name.pt" "$@" > "$out/$name.txt" 2>&1
    rc=$?
    tail -n 25 "$out/$name.txt"
    cp "$work/$name/ledger.jsonl" "$out/${name}_ledger.jsonl" 2>/dev/null
    return $rc
}

compare() {  # compare CLEAN OTHER: two jobs' final weights, bit for bit; OTHER's recoveries
    timeout -k 5 120 "$py" - "$work/$1.pt" "$work/$2.pt" "$work/$2/ledger.jsonl" <<'EOF2'
import json, sys
import torch
clean, other = (torch.load(p, map_location="cpu", weights_only=True) for p in sys.argv[1:3])
differ = [k for k in clean if k not in other or not torch.equal(clean[k], other[k])]
warned = []
size = sum(t.numel() * t.element_size() for t in clean.values())
print(f"{len(clean)} tensors ({size / 1e6:.1f} MB of weights), {len(differ)} differ", differ[:5])
for line in open(sys.argv[3]):
    event = json.loads(line)
    if event["event"] == "recovery_done":
        t = event["timeline"]
        ms = {k: round((v - t["detected"]) * 1e3, 1) for k, v in t.items()}
        keep = ("lost_steps", "recomputed_steps", "bytes_transferred", "stall_seconds")
        print({k: event.get(k) for k in keep}, ms)
    if event["event"] == "job_end":
        print("job_end", event["status"], "steps", event["steps_committed"])
    if event["event"] == "warning":  # replicated_state_differs: the on-GPU digest disagreed
        print("warning", event["what"], event["objects"], event["step"])
        warned.append(event["what"])
sys.exit(1 if differ or warned or set(clean) != set(other) else 0)
EOF2
}

kills=(--chaos kill:rank=1:step=40:phase=backward --chaos kill:rank=0:step=80)
small=(--steps 120)
big=(--steps 40 --dim "$dim" --layers "$layers" --heads "$heads" --log-every 5)
step facts facts
if [ "$cpu" = 1 ]; then
    results+=("nvml tests: skipped (CPU dry run)")
else
    step "nvml tests" timeout -k 5 120 "$py" -m pytest -q -p no:cacheprovider tests/test_health_nvml.py
fi
step "nvml readings" readings
step "failure-free job ($device)" job clean "$device" --nproc-per-node 2 --spares 1 -- "${small[@]}"
step "2 kills ($device, forked workers)" job kills "$device" --nproc-per-node 2 --spares 1 \
    "${kills[@]}" -- "${small[@]}"
step "weights and recoveries, forked" compare clean kills
step "2 kills ($device, --no-template)" job fresh "$device" --nproc-per-node 2 --spares 1 \
    --no-template "${kills[@]}" -- "${small[@]}"
step "weights and recoveries, --no-template" compare clean fresh
step "failure-free large model ($device)" job clean_large "$device" --nproc-per-node 2 \
    --spares 1 -- "${big[@]}"
step "1 kill, large model ($device)" job kills_large "$device" --nproc-per-node 2 --spares 1 \
    --chaos kill:rank=1:step=20:phase=backward -- "${big[@]}"
step "weights and recovery, large model" compare clean_large kills_large
if [ "$cpu" = 1 ]; then
    results+=("nccl job: skipped (CPU dry run)")
else
    step "nccl job (one worker)" job nccl "" --nproc-per-node 1 --spares 0 -- "${small[@]}"
fi
step "exit holder ($device)" cuda_holder
step "2 kills ($device, forked workers, exit holder)" holder_job kills_holder "$device" \
    --nproc-per-node 2 --spares 1 "${kills[@]}" -- "${small[@]}"
step "weights and recoveries, exit holder" compare clean kills_holder
step "bench.stall on the CPUs" env TORCHRELAY_DEVICE=cpu timeout -k 10 300 \
    "$py" -m bench.stall --pairs "$pairs"
step "bench.exit_floor on the CPUs" env TORCHRELAY_DEVICE=cpu timeout -k 10 180 \
    "$py" -m bench.exit_floor --samples 5
step "bench.xfer on the CPUs" env TORCHRELAY_DEVICE=cpu timeout -k 10 240 \
    "$py" -m bench.xfer --mb "$xfer_mb" --repeats 3
echo "=== summary"
printf '%s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -qv ": exit 0\|skipped"
