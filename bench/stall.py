"""``python -m bench.stall``: torchrelay's recovery phases per SIGKILL, this tree against another.

Runs torchrelay jobs with kills (``bench.config``'s small scenario by default: 3 kills in 540
steps) alternately with this checkout's ``src`` and, if ``--baseline-src`` names one, another
checkout's (``BENCH_SRC``, see :func:`bench.procs.worker_env`), ``--pairs`` times, and prints
the median (min-max) of each ledger phase (detect, plan, communicator, transfer, first step),
kill -> first step, the bench's stall and time lost per failure (``bench.metrics``), the CPU
each refill spare used until ready and the transfer's MB/s, for each tree, and the differences
with their 95 % intervals: on this 2-core VM the interval of the total is about +-10 ms with 9
kills a tree (``--pairs 3``) and +-6 ms with 15 (bench/analysis.md, "Tenth pass"). A second
table shows, per tree, each of the first steps after the stall over the pace before its kill
(``metrics.after_stall``): the slow steps a kill's time lost beyond its stall is made of.
``--baseline-env KEY=VALUE`` (repeatable) runs the baseline with those environment settings,
on this tree when no ``--baseline-src`` is given: a switch measured on and off in turn, e.g.
``TORCHRELAY_HUGEPAGES=0``.
``--resident-gib`` makes each worker hold that much more host memory, as real trainers do:
what the kernel unmaps when one is killed.
Both trees run the same worker scripts (this checkout's ``bench/workers``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

from bench import metrics
from bench.config import PRESETS
from bench.procs import environment
from bench.runner import JobResult, run_job
from bench.systems import TorchrelaySpare
from bench.workload import RESIDENT_GIB

PHASES = ("detect", "plan", "communicator", "transfer", "first_step", "total")
TOTALS = ("stall", "time_lost")  # the bench's, from rank 0's commits (bench.metrics)
# The CPU each refill spare (started after a recovery) used until ready: what it took from
# the workers on a node whose cores they fill (bench.metrics.refill_cpu).
SPARES = ("refill_cpu",)


def _cell(values: list[float], scale: float = 1e3) -> str:
    s = metrics.spread(values)
    return f"{s.median * scale:.1f} ({s.lo * scale:.1f}-{s.hi * scale:.1f})"


def _samples(jobs: list[JobResult]) -> dict[str, list[float]]:
    """Each phase's values (s), the stalls and time lost (s) and the transfer rates (B/s), per
    kill; the refill spares' CPU (s), per refill."""
    phases = [p for j in jobs for p in j.phases]
    samples = {name: [getattr(p, name) for p in phases] for name in PHASES}
    samples["stall"] = [i.stall_s for j in jobs for i in j.impacts]
    samples["time_lost"] = [i.time_lost_s for j in jobs for i in j.impacts]
    samples["refill_cpu"] = [cpu for j in jobs for cpu in j.refill_cpu_s]
    samples["rate"] = [p.transfer_bytes_per_s for p in phases]
    return samples


def table(results: dict[str, list[JobResult]]) -> str:
    """A markdown table: one row per tree, phases in ms; with two trees, a last row of the
    differences of their medians with 95 % bootstrap intervals (``metrics.median_difference``):
    a difference whose interval spans 0 is within this run's noise."""
    columns = (*PHASES, *TOTALS, *SPARES)
    head = "| tree | " + " | ".join(f"{name} ms" for name in columns) + " | MB/s | n |"
    rows = [head, "|" + "---|" * (len(columns) + 3)]
    samples = {tree: _samples(jobs) for tree, jobs in results.items()}
    for tree, sample in samples.items():
        cells = [_cell(sample[name]) for name in columns]
        rate = _cell(sample["rate"], 1e-6)
        rows.append(f"| {tree} | {' | '.join(cells)} | {rate} | {len(sample['total'])} |")
    if len(samples) == 2:
        mine, base = samples.values()
        diffs = [_difference(mine[name], base[name]) for name in columns]
        rate = _difference(mine["rate"], base["rate"], 1e-6)
        rows.append(f"| difference (95 % interval) | {' | '.join(diffs)} | {rate} | |")
    return "\n".join(rows)


def after_stall_table(results: dict[str, list[JobResult]]) -> str:
    """A markdown table: per tree, the median over its kills of each step's time after the
    stall (``metrics.after_stall``: 1 is the pace before the kill), and how many kills."""
    positions = range(metrics.AFTER_STALL)
    head = "| tree | " + " | ".join(f"step {i + 1}" for i in positions) + " | kills |"
    rows = [head, "|" + "---|" * (metrics.AFTER_STALL + 2)]
    for tree, jobs in results.items():
        series = [ratios for job in jobs for ratios in job.after_stall]
        cells = []
        for i in positions:
            at = [ratios[i] for ratios in series if len(ratios) > i]
            cells.append(f"{statistics.median(at):.2f}" if at else "-")
        rows.append(f"| {tree} | {' | '.join(cells)} | {len(series)} |")
    return "\n".join(rows)


def _difference(a: list[float], b: list[float], scale: float = 1e3) -> str:
    d = metrics.median_difference(a, b)
    mark = "" if d.resolved else " (noise)"
    return f"{d.median * scale:+.1f} [{d.lo * scale:+.1f}, {d.hi * scale:+.1f}]{mark}"


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not key or not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


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
    parser.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=VALUE",
        help="an environment setting for the baseline's jobs (repeatable)",
    )
    args = parser.parse_args()
    os.environ[RESIDENT_GIB] = str(args.resident_gib)
    config = PRESETS["default"]
    scenario = next(s for s in config.scenarios if s.model == args.model)
    # Each tree's environment settings; the baseline's tree is named by BENCH_SRC.
    trees: dict[str, dict[str, str]] = {"this tree": {}}
    if args.baseline_src or args.baseline_env:
        trees["baseline"] = dict(args.baseline_env)
        if args.baseline_src:
            trees["baseline"]["BENCH_SRC"] = str(args.baseline_src.resolve())
    results: dict[str, list[JobResult]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
        for pair in range(args.pairs):
            for tree, settings in trees.items():
                workdir = Path(tmp) / f"{tree.replace(' ', '_')}{pair}"
                with environment(settings):
                    job = run_job(TorchrelaySpare(), scenario, config, pair, True, workdir)
                if job.error:
                    raise SystemExit(f"{tree}: {job.error}")
                results[tree].append(job)
                phases = [dataclasses.asdict(p) for p in job.phases]
                stalls = [i.stall_s for i in job.impacts]
                print(f"pair {pair} {tree}: {json.dumps({'phases': phases, 'stalls': stalls})}")
    print(table(results))
    print("\nEach step's time after the stall over the pace before its kill (median of the kills):")
    print(after_stall_table(results))


if __name__ == "__main__":
    main()
