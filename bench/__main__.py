"""``python -m bench [--quick] [--out-dir DIR]``: run every system, write the report and plot.

Without ``--out-dir`` the report goes to ``docs/benchmarks.md`` and the plot to
``docs/img/bench_progress.png``; with it, both (and ``results.json``) go to DIR. Job files
(logs, progress, weights) live in ``--work-dir`` (a temporary directory unless given).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench.config import PRESETS
from bench.plot import plot_progress
from bench.procs import REPO_ROOT
from bench.report import render
from bench.runner import BenchResults, JobResult, run_all
from bench.systems import make_systems

ANALYSIS = Path(__file__).with_name("analysis.md")


def _summary(job: JobResult) -> str:
    if job.error:
        return f"[red]{job.system} {job.model} r{job.repeat}: {job.error}"
    stalls = ", ".join(f"{i.stall_s:.2f}" for i in job.impacts)
    return (
        f"[green]{job.system:14s}[/] {job.model} r{job.repeat} failures={job.failures} "
        f"wall {job.wall_s:.1f} s, {job.steady_steps_per_s:.1f} steps/s"
        + (f", stall s: {stalls}" if stalls else "")
    )


def _json(results: BenchResults) -> dict[str, object]:
    """Raw results (commits left out: they are in the job directories)."""

    def clean(value: object) -> object:
        return None if isinstance(value, float) and math.isnan(value) else value

    jobs = []
    for job in results.jobs:
        row = {k: clean(v) for k, v in dataclasses.asdict(job).items() if k != "commits"}
        row["weights"] = str(job.weights) if job.weights else None
        jobs.append(row)
    return {
        "config": dataclasses.asdict(results.config),
        "jobs": jobs,
        "broadcast_bytes_per_s": results.broadcast_bps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="CI smoke test (< 3 min)")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    config = PRESETS["quick" if args.quick else "default"]
    if args.out_dir:
        report, image = args.out_dir / "benchmarks.md", args.out_dir / "bench_progress.png"
    else:
        report = REPO_ROOT / "docs" / "benchmarks.md"
        image = REPO_ROOT / "docs" / "img" / "bench_progress.png"
    console = Console()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        workdir = args.work_dir or Path(tmp)
        total = sum(s.repeats * 7 for s in config.scenarios)  # 4 failure-free + 3 with kills
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("starting", total=total)

            def on_done(job: JobResult) -> None:
                progress.advance(task)
                progress.console.print(_summary(job))

            results = run_all(
                config,
                make_systems(config.ckpt_every, config.heartbeat_ms),
                workdir,
                lambda d: progress.update(task, description=d),
                on_done,
            )
        elapsed = time.monotonic() - started
        machine = {
            "machine": f"`nproc` = {os.cpu_count()}, {platform.platform()}, Python "
            f"{platform.python_version()}",
            "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        }
        command = "python -m bench" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
        plot_progress(results, image)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(
            render(
                results,
                command,
                machine,
                elapsed,
                ANALYSIS.read_text() if ANALYSIS.exists() else "",
            )
        )
        if args.out_dir:
            (args.out_dir / "results.json").write_text(
                json.dumps(_json(results), indent=1, default=str)
            )
    console.print(f"wrote {report} and {image} in {elapsed / 60:.1f} min")
    return 1 if any(j.error for j in results.jobs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
