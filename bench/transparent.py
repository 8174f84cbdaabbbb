"""``python -m bench.transparent``: the steady-state cost of the transparent hook (issue 16).

The same unmodified DDP script (``bench/workers/plain_steps.py``, steps of tens of ms on one
thread) runs failure-free, 2 workers, under plain ``torchrun`` and under ``torchrelay run
--transparent --spares 0``, interleaved (A B A B ...), ``--pairs`` times: on a shared machine
only ratios within a pair mean anything. Both sides are measured the same way, inside the
script on rank 0 after each ``optimizer.step()``: steps/s and CPU seconds per step over the
last 80 % of the steps. The hook's own per-step work (the commit, which takes the next
boundary snapshot, and each snapshot alone) is timed in the torchrelay workers with
``perf_counter`` over every step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench.procs import WORKERS, ProcessSet, free_port, wait_exit, worker_env

SCRIPT = WORKERS / "plain_steps.py"
# torch's own teardown, not the script's nor torchrelay's: a gloo thread that drops a finished
# all-reduce during interpreter shutdown aborts the process (pytorch/pytorch#190489; the core
# dump's frames: tests/test_transparent_multiprocess.py, whose runs retry by these too). Plain
# torchrun hit it in 1 run of 8-14 here, after its last step; a job that ended so runs again.
TORCH_TEARDOWN_ABORT = "terminate called without an active exception"
# Beside a CPU hog, 3 of 20 plain torchrun runs of tests/scripts/torchrun_ddp.py aborted so
# (2026-12-07), and a CI run saw 3 in a row: five tries leave ~1e-4 at that rate.
ATTEMPTS = 5

Result = TypeVar("Result")


def torch_aborted(returncode: int | None, output: str) -> bool:
    """Whether a run that printed ``output`` failed with torch's teardown abort among its faults."""
    return returncode != 0 and TORCH_TEARDOWN_ABORT in output


def unless_torch_aborted(
    attempt: Callable[[int], Result], aborted: Callable[[Result], bool]
) -> Result:
    """``attempt(0)``, then ``attempt(1)`` ... while ``aborted`` says the last one ended only in
    torch's teardown abort, ATTEMPTS tries at most; the last one's result, aborted or not."""
    for number in range(ATTEMPTS):
        result = attempt(number)
        if not aborted(result):
            break
    return result


def _command(launcher: str, workdir: Path, steps: int) -> list[str]:
    if launcher == "torchrun":
        head = [sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port())]
    else:
        head = [sys.executable, "-m", "torchrelay.cli.main", "run", "--transparent"]
        head += ["--spares", "0", "--run-dir", str(workdir / "run")]
    return [*head, "--nproc-per-node", "2", str(SCRIPT), "--steps", str(steps)]


def steady(marks: list[list[float]]) -> dict[str, float]:
    """Steps/s and CPU s/step over the last 80 % of ``marks`` (wall, CPU time after a step)."""
    first = len(marks) // 5
    (wall0, cpu0), (wall1, cpu1) = marks[first], marks[-1]
    steps = len(marks) - 1 - first
    return {"steps_per_s": steps / (wall1 - wall0), "cpu_s_per_step": (cpu1 - cpu0) / steps}


def run_job(launcher: str, workdir: Path, steps: int, timeout_s: float) -> dict:
    """One failure-free job; its steady figures and (torchrelay) the hook's timings in µs.
    Run again (in ``workdir``-1, -2 ...) only if it ended in torch's teardown abort."""

    def attempt(number: int) -> tuple[int | None, Path, str]:
        directory = workdir.with_name(f"{workdir.name}-{number}") if number else workdir
        directory.mkdir(parents=True)
        env = worker_env(BENCH_STEP_LOG=str(directory / "steps.json"), BENCH_HOOK_TIMES="1")
        with ProcessSet() as procs:
            proc = procs.start(_command(launcher, directory, steps), directory / "out.log", env=env)
            code = wait_exit(proc, time.monotonic() + timeout_s)
        # The work directory is temporary: what the launcher printed goes with an error.
        return code, directory, (directory / "out.log").read_text(errors="replace")[-3000:]

    code, directory, output = unless_torch_aborted(
        attempt, lambda done: torch_aborted(done[0], done[2])
    )
    log = directory / "steps.json"
    if code != 0 or not log.is_file():
        raise RuntimeError(f"{launcher} exited with {code}; its output ends:\n{output}")
    recorded = json.loads(log.read_text())
    hook = {
        name: {
            "calls": len(v),
            "median_us": statistics.median(v) * 1e6,
            "mean_us": 1e6 * sum(v) / len(v),
        }
        for name, v in recorded["hook"].items()
    }
    return {**steady(recorded["marks"]), "hook": hook}


def _spread(name: str, ratios: list[float]) -> str:
    low, high = min(ratios), max(ratios)
    return f"{name}: median {statistics.median(ratios):.3f}, range {low:.3f}-{high:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    parser.add_argument("--json", type=Path, default=None, help="write every job's figures")
    args = parser.parse_args()
    pairs = []
    with tempfile.TemporaryDirectory(prefix="bench-transparent-") as tmp:
        for pair in range(args.pairs):
            plain, relay = (
                run_job(name, Path(tmp) / f"{name}{pair}", args.steps, args.timeout)
                for name in ("torchrun", "torchrelay")
            )
            pairs.append({"torchrun": plain, "torchrelay": relay})
            print(f"pair {pair}: {json.dumps(pairs[-1])}", flush=True)
    speed = [p["torchrelay"]["steps_per_s"] / p["torchrun"]["steps_per_s"] for p in pairs]
    cpu = [p["torchrelay"]["cpu_s_per_step"] / p["torchrun"]["cpu_s_per_step"] for p in pairs]
    print(_spread("steps/s, transparent / torchrun", speed))
    print(_spread("CPU s/step, transparent / torchrun", cpu))
    for name in pairs[0]["torchrelay"]["hook"]:
        medians = [p["torchrelay"]["hook"][name]["median_us"] for p in pairs]
        means = [p["torchrelay"]["hook"][name]["mean_us"] for p in pairs]
        print(
            f"hook {name}: per call median {statistics.median(medians):.0f} µs, "
            f"mean {statistics.median(means):.0f} µs (medians over pairs)"
        )
    if args.json:
        args.json.write_text(json.dumps({"pairs": pairs, "speed": speed, "cpu": cpu}))


if __name__ == "__main__":
    main()
