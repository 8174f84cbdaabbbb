"""``python -m bench.checkpoint``: what durable checkpoints cost a running job, and a resume.

1. In one process (no job): the time the training loop is blocked per checkpoint (the staging
   copy to host memory) against the time until the checkpoint is complete on disk (written by
   DCP in the background, checksummed, renamed), and a synchronous ``dcp.save`` of the same
   state, for tracked states of ``--sizes`` MB (weights + AdamW moments).
2. Real ``torchrelay run`` jobs (2 workers, no spare) of a ~``--job-mb`` MB state: steps per
   second without checkpoints and with ``--checkpoint-every N`` (the ratio, same machine, same
   run), then ``--resume`` of the checkpointed job: the time from starting the command to its
   first step, against the same for the fresh start.

Prints a markdown section for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from torchrelay import checkpoints as layout
from torchrelay.runtime.checkpoint import Checkpointer
from torchrelay.runtime.tracked import TrackedState

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "bench" / "workers" / "ckpt_worker.py"
BYTES_PER_PARAM = 12  # fp32 weight + AdamW's exp_avg and exp_avg_sq


def width_for(megabytes: float) -> int:
    """The width of one square Linear layer whose weights + moments are about ``megabytes``."""
    return int((megabytes * 1e6 / BYTES_PER_PARAM) ** 0.5)


def tracked_state(megabytes: float) -> tuple[TrackedState, float]:
    width = width_for(megabytes)
    net = torch.nn.Linear(width, width)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(2, width)).sum().backward()
    opt.step()
    tracked = TrackedState()
    tracked.add("model", net)
    tracked.add("optimizer", opt)
    size = sum(p.numel() for p in net.parameters()) * BYTES_PER_PARAM / 1e6
    return tracked, size


def in_process(megabytes: float, repeats: int, work: Path) -> dict[str, float]:
    tracked, size = tracked_state(megabytes)
    root = work / f"inproc-{megabytes:g}"
    writer = Checkpointer(root, layout.Every(steps=1), 1, lambda: None, lambda: 0, print)
    blocked, complete, sync = [], [], []
    for step in range(repeats):
        started = time.perf_counter()
        writer.after_commit(step, 0, tracked, None)
        blocked.append(time.perf_counter() - started)
        while step not in layout.complete_steps(root):
            time.sleep(0.001)
        complete.append(time.perf_counter() - started)
    writer.close()
    flat = {f"t{i}": t for i, t in enumerate(_tensors(tracked.state()))}
    for step in range(repeats):
        started = time.perf_counter()
        dcp.save(flat, checkpoint_id=str(work / f"sync-{megabytes:g}-{step}"), no_dist=True)
        sync.append(time.perf_counter() - started)
    return {
        "mb": size,
        "blocked": statistics.median(blocked),
        "complete": statistics.median(complete),
        "sync": statistics.median(sync),
    }


def _tensors(state: object) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in _tensors(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _tensors(v)]
    return []


def job(work: Path, name: str, steps: int, width: int, *extra: str) -> dict[str, object]:
    """Run one job to its end; its per-step times and how long until its first step."""
    run_dir = work / "run-ckpt" if name != "plain" else work / "run-plain"
    out = work / f"{name}.json"
    command = [
        sys.executable,
        "-m",
        "torchrelay.cli.main",
        "run",
        "--nproc-per-node",
        "2",
        "--spares",
        "0",
        "--quiet",
        "--run-dir",
        str(run_dir),
        *extra,
        str(WORKER),
        "--steps",
        str(steps),
        "--width",
        str(width),
        "--out",
        str(out),
    ]
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    started = time.time()
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}
    )
    if done.returncode != 0:
        raise SystemExit(f"bench.checkpoint: the {name} job failed:\n{done.stdout[-3000:]}")
    result = json.loads(out.read_text())
    times = [t for _, t in result["steps"]]
    skip = len(times) // 4  # warm-up: the first quarter
    return {
        "rate": (len(times) - skip - 1) / max(1e-9, times[-1] - times[skip]),
        "first_step": times[0] - started,
        "first": result["steps"][0][0],
        "blocked": result["blocked"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint", description=__doc__)
    parser.add_argument("--sizes", default="15,100", help="in-process state sizes, MB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--job-mb", type=float, default=15.0)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        work = Path(tmp)
        sizes = [in_process(float(mb), args.repeats, work) for mb in args.sizes.split(",")]
        width = width_for(args.job_mb)
        plain = job(work, "plain", args.steps, width)
        flags = ("--checkpoint-dir", str(work / "ckpt"), "--checkpoint-every", str(args.every))
        saved = job(work, "checkpointed", args.steps, width, *flags)
        # Its last checkpoint is at its last step: the resumed job goes on for more steps.
        resumed = job(work, "resumed", args.steps + args.every, width, *flags, "--resume")
    load = os.getloadavg()[0]
    print("## Durable checkpoints: blocking time, throughput, resume (issue 11)\n")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"- command: `python -m bench.checkpoint`, {when}")
    print(
        f"- machine: `nproc` = {os.cpu_count()}, {platform.platform()}, load average {load:.1f}; "
        f"torch {torch.__version__}, CPU, local disk\n"
    )
    print(
        "| tracked state MB | loop blocked (staging) ms | until complete on disk ms | "
        "synchronous dcp.save ms |"
    )
    print("|---|---|---|---|")
    for s in sizes:
        print(
            f"| {s['mb']:.0f} | {s['blocked'] * 1e3:.1f} | {s['complete'] * 1e3:.0f} | "
            f"{s['sync'] * 1e3:.0f} |"
        )
    blocked = saved["blocked"]
    mb = width * width * BYTES_PER_PARAM / 1e6
    print(
        f"\nJobs: 2 workers, {args.steps} steps, {mb:.0f} MB of tracked state, steps/s "
        f"over the last three quarters:\n"
    )
    print("| job | steps/s | ratio | loop blocked per checkpoint, ms (rank 0, median) |")
    print("|---|---|---|---|")
    print(f"| no checkpoints | {plain['rate']:.1f} | 1.00 | - |")
    print(
        f"| --checkpoint-every {args.every} | {saved['rate']:.1f} | "
        f"{saved['rate'] / plain['rate']:.2f} | "
        f"{statistics.median(blocked) * 1e3:.1f} ({len(blocked)} checkpoints) |"
    )
    print(
        f"\nTime from starting `torchrelay run` to the first committed step: fresh start "
        f"{plain['first_step']:.2f} s; `--resume` (from step {resumed['first'] - 1}) "
        f"{resumed['first_step']:.2f} s."
    )


if __name__ == "__main__":
    main()
