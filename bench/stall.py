"""``python -m bench.stall``: torchrelay's recovery phases per SIGKILL, this tree against another.

Runs torchrelay jobs with kills (``bench.config``'s small scenario by default: 3 kills in 540
steps) alternately with this checkout's ``src`` and, if ``--baseline-src`` names one, another
checkout's (``BENCH_SRC``, see :func:`bench.procs.worker_env`), ``--pairs`` times, and prints
the median (min-max) of each ledger phase (detect, plan, communicator, transfer, first step),
kill -> first step, the bench's stall per failure and the transfer's MB/s, for each tree.
``--resident-gib`` makes each worker hold that much more host memory, as real trainers do:
what the kernel unmaps when one is killed.
Both trees run the same worker scripts (this checkout's ``bench/workers``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from pathlib import Path

from bench import metrics
from bench.config import PRESETS
from bench.runner import JobResult, run_job
from bench.systems import TorchrelaySpare
from bench.workload import RESIDENT_GIB

PHASES = ("detect", "plan", "communicator", "transfer", "first_step", "total")


def _cell(values: list[float], scale: float = 1e3) -> str:
    s = metrics.spread(values)
    return f"{s.median * scale:.1f} ({s.lo * scale:.1f}-{s.hi * scale:.1f})"


def table(results: dict[str, list[JobResult]]) -> str:
    """A markdown table: one row per tree, phases in ms."""
    head = "| tree | " + " | ".join(f"{p} ms" for p in PHASES) + " | stall ms | MB/s | n |"
    rows = [head, "|" + "---|" * (len(PHASES) + 4)]
    for tree, jobs in results.items():
        phases = [p for j in jobs for p in j.phases]
        stalls = [i.stall_s for j in jobs for i in j.impacts]
        cells = [_cell([getattr(p, name) for p in phases]) for name in PHASES]
        rate = _cell([p.transfer_bytes_per_s for p in phases], 1e-6)
        rows.append(f"| {tree} | {' | '.join(cells)} | {_cell(stalls)} | {rate} | {len(phases)} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--model", default="small", choices=("small", "large"))
    parser.add_argument("--baseline-src", type=Path, default=None)
    parser.add_argument(
        "--resident-gib",
        type=float,
        default=0.0,
        help="host memory each worker holds besides its state, as a real trainer does",
    )
    args = parser.parse_args()
    os.environ[RESIDENT_GIB] = str(args.resident_gib)
    config = PRESETS["default"]
    scenario = next(s for s in config.scenarios if s.model == args.model)
    trees = {"this tree": None}
    if args.baseline_src:
        trees["baseline"] = str(args.baseline_src.resolve())
    results: dict[str, list[JobResult]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
        for pair in range(args.pairs):
            for tree, src in trees.items():
                os.environ.pop("BENCH_SRC", None)
                if src:
                    os.environ["BENCH_SRC"] = src
                workdir = Path(tmp) / f"{tree.replace(' ', '_')}{pair}"
                job = run_job(TorchrelaySpare(), scenario, config, pair, True, workdir)
                if job.error:
                    raise SystemExit(f"{tree}: {job.error}")
                results[tree].append(job)
                phases = [dataclasses.asdict(p) for p in job.phases]
                stalls = [i.stall_s for i in job.impacts]
                print(f"pair {pair} {tree}: {json.dumps({'phases': phases, 'stalls': stalls})}")
    print(table(results))


if __name__ == "__main__":
    main()
