#!/usr/bin/env bash
# torchrelay's GPU check: one prepared run on a machine with one NVIDIA GPU (issue 15, "GPU").
#
#   bash scripts/gpu_check.sh OUT_DIR
#
# Each step is timed and goes on when an earlier one failed; everything printed is also in
# OUT_DIR/gpu_check.log, and each job's ledger is copied to OUT_DIR. The steps:
#   1. facts: nvidia-smi, the torch, CUDA and NCCL versions, the GPU torch sees;
#   2. the NVML tests against the real driver (CI skips them: it has no nvidia-ml-py);
#   3. NVML readings as torchrelay's health poller takes them;
#   4. recovery with CUDA state: examples/train_gpt.py, 2 workers and 1 spare sharing GPU 0
#      (TORCHRELAY_DEVICE=cuda:0, so gloo reduces the CUDA tensors: NCCL refuses two ranks on one
#      GPU), once failure-free and once with rank 1 SIGKILLed in its backward pass and rank 0 in
#      its forward; the final weights compared bit for bit, the recoveries read from the ledger;
#   5. NCCL: the same script, one worker on GPU 0 with the non-blocking NCCL communicator (a
#      recovery between NCCL ranks needs a second GPU).
# GPU_CHECK_CPU=1 runs steps 3-4 on the CPU instead (TORCHRELAY_DEVICE=cpu) and skips 5: a dry
# run of this script on a machine without a GPU.
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
[ "$cpu" = 1 ] && device=cpu
exec > >(tee "$out/gpu_check.log") 2>&1
results=()

step() {  # step NAME COMMAND...: run, time, record the exit status
    local name=$1 start rc
    shift
    echo "=== $name"
    start=$(date +%s.%N)
    "$@"
    rc=$?
    printf '=== %s: exit %s after %.1f s\n\n' "$name" "$rc" "$(echo "$(date +%s.%N) - $start" | bc)"
    results+=("$name: exit $rc")
}

facts() {
    nvidia-smi || echo "(no nvidia-smi)"
    "$py" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
    print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
EOF
}

readings() {
    "$py" - <<'EOF'
import json
from torchrelay.health.nvml import NvmlSource
source = NvmlSource("node0")
print("enabled", source.enabled)
for reading in source.read() if source.enabled else []:
    print(json.dumps(vars(reading), default=str))
source.close()
EOF
}

job() {  # job NAME TORCHRELAY_DEVICE ARGS...: a train_gpt.py job, its ledger copied out
    local name=$1 dev=$2 rc
    shift 2
    TORCHRELAY_DEVICE=$dev "$py" -m torchrelay.cli.main run --run-dir "$work/$name" "$@" \
        src/torchrelay/examples/train_gpt.py --steps 120 --out "$work/$name.pt"
    rc=$?
    cp "$work/$name/ledger.jsonl" "$out/${name}_ledger.jsonl" 2>/dev/null
    return $rc
}

compare() {  # the two jobs' final weights, bit for bit, and the recoveries' timelines
    "$py" - "$work/clean.pt" "$work/kills.pt" "$work/kills/ledger.jsonl" <<'EOF'
import json, sys
import torch
clean, kills = (torch.load(p, map_location="cpu", weights_only=True) for p in sys.argv[1:3])
differ = [k for k in clean if not torch.equal(clean[k], kills[k])]
print(f"{len(clean)} tensors, {len(differ)} differ", differ[:5])
for line in open(sys.argv[3]):
    event = json.loads(line)
    if event["event"] == "recovery_done":
        t = event["timeline"]
        ms = {k: round((v - t["detected"]) * 1e3, 1) for k, v in t.items()}
        keep = ("lost_steps", "recomputed_steps", "bytes_transferred", "stall_seconds")
        print({k: event.get(k) for k in keep}, ms)
sys.exit(1 if differ or set(clean) != set(kills) else 0)
EOF
}

step facts facts
if [ "$cpu" = 1 ]; then
    results+=("nvml tests: skipped (CPU dry run)")
else
    step "nvml tests" "$py" -m pytest -q -p no:cacheprovider tests/test_health_nvml.py
fi
step "nvml readings" readings
step "failure-free job ($device)" job clean "$device" --nproc-per-node 2 --spares 1
step "job with 2 kills ($device)" job kills "$device" --nproc-per-node 2 --spares 1 \
    --chaos kill:rank=1:step=40:phase=backward --chaos kill:rank=0:step=80
step "weights and recoveries" compare
if [ "$cpu" = 1 ]; then
    results+=("nccl job: skipped (CPU dry run)")
else
    step "nccl job (one worker)" job nccl "" --nproc-per-node 1 --spares 0
fi
echo "=== summary"
printf '%s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -qv ": exit 0\|skipped"
