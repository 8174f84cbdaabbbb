"""``python -m bench.steady_check``: plain DDP vs torchrelay steady state, alternated A/B.

The main benchmark runs each system's failure-free job once per repeat, minutes apart, so on a
shared machine the steady-state ratio mostly measures other people's load. This check runs
short failure-free jobs of the two systems back to back, ``--pairs`` times, and prints each
job's steps/s (after the first 20 % of steps) and each pair's ratio.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench import metrics
from bench.systems import PlainDDP, RunSpec, System, TorchrelaySpare


def steady_steps_per_s(system: System, workdir: Path, model: str, steps: int) -> float:
    """Runs one failure-free job of ``system``; returns its steady steps/s."""
    workdir.mkdir(parents=True)
    spec = RunSpec(model, steps, 2, (), 1, workdir, timeout_s=180.0)
    out = system.run(spec)
    if out.returncode != 0:
        raise RuntimeError(f"{system.name} exited with {out.returncode}; logs in {workdir}")
    return metrics.steady_rate(metrics.parse_progress(spec.progress_file.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="small")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-steady-") as tmp:
        for pair in range(args.pairs):
            ddp, relay = (
                steady_steps_per_s(
                    system, Path(tmp) / f"{system.name}{pair}", args.model, args.steps
                )
                for system in (PlainDDP(), TorchrelaySpare())
            )
            print(
                f"pair {pair}: plain DDP {ddp:.1f} steps/s, torchrelay {relay:.1f} steps/s, "
                f"ratio {relay / ddp:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
