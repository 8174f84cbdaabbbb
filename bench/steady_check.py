"""``python -m bench.steady_check``: plain DDP vs torchrelay steady state, interleaved A/B.

The main benchmark runs each system's failure-free job once per repeat, minutes apart, so on a
shared machine the steady-state ratio mostly measures other people's load. This check runs
short failure-free jobs of the two systems alternately (A B A B ...), ``--pairs`` times, and
prints each job's steps/s (after the first 20 % of steps), its rank 0's CPU seconds per step
and runtime facts (thread pools, affinity, OS threads; :class:`bench.workload.RuntimeFacts`),
each pair's ratios, and their median and range. CPU seconds per step is a cost that the
machine's load does not change, so its ratio is the steadier of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from bench import metrics
from bench.systems import PlainDDP, RunSpec, System, TorchrelaySpare


def steady_job(system: System, workdir: Path, model: str, steps: int) -> dict:
    """Runs one failure-free job of ``system``; its steady steps/s and rank 0's facts."""
    workdir.mkdir(parents=True)
    spec = RunSpec(model, steps, 2, (), 1, workdir, timeout_s=180.0)
    os.environ["BENCH_FACTS"] = str(workdir / "facts.json")  # the workers inherit it
    out = system.run(spec)
    if out.returncode != 0:
        raise RuntimeError(f"{system.name} exited with {out.returncode}; logs in {workdir}")
    rate = metrics.steady_rate(metrics.parse_progress(spec.progress_file.read_text()))
    return {"steps_per_s": rate, **json.loads((workdir / "facts.json").read_text())}


def _summary(name: str, ratios: list[float]) -> str:
    return (
        f"{name}: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="small")
    parser.add_argument("--json", type=Path, default=None, help="write every job's figures")
    args = parser.parse_args()
    jobs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-steady-") as tmp:
        for pair in range(args.pairs):
            ddp, relay = (
                steady_job(system, Path(tmp) / f"{system.name}{pair}", args.model, args.steps)
                for system in (PlainDDP(), TorchrelaySpare())
            )
            jobs.append({"ddp": ddp, "torchrelay": relay})
            for name, job in (("plain DDP", ddp), ("torchrelay", relay)):
                print(f"pair {pair} {name}: {json.dumps(job)}", flush=True)
            print(
                f"pair {pair}: steps/s ratio {relay['steps_per_s'] / ddp['steps_per_s']:.3f}, "
                f"CPU s/step ratio {relay['cpu_s_per_step'] / ddp['cpu_s_per_step']:.3f}",
                flush=True,
            )
    speed = [j["torchrelay"]["steps_per_s"] / j["ddp"]["steps_per_s"] for j in jobs]
    cpu = [j["torchrelay"]["cpu_s_per_step"] / j["ddp"]["cpu_s_per_step"] for j in jobs]
    print(_summary("steps/s, torchrelay / plain DDP", speed))
    print(_summary("CPU s/step, torchrelay / plain DDP", cpu))
    if args.json:
        args.json.write_text(json.dumps({"pairs": jobs, "speed": speed, "cpu": cpu}))


if __name__ == "__main__":
    main()
