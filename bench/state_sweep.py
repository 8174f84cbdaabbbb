"""``python -m bench.state_sweep``: a recovery's stall against the size of the state it moves.

Runs one torchrelay job per size in ``--sizes`` (MB of weights and AdamW state: the
``state:MB`` models of :func:`bench.workload.model_size`, the small model made wider), each
with 2 workers and 1 hot spare on the shared workload, SIGKILLing rank 1 at each of ``--kills``;
just before each job, the gloo broadcast floor of the same bytes (``bench.probe``). Per kill:

- **stall**: the bench's (``bench.metrics``): kill -> the first new commit that 5 steps at a
  normal pace follow;
- **kill -> first step**: the ledger's, kill -> the recovery's first step reported;
- **transfer**: the ledger's ``comm_ready -> transfer_done``;
- **step**: the median step before the kill. A stall holds about two of them (the survivors'
  step in flight when the kill lands, and the recomputed step), and a step's work grows with
  the state as the transfer does.

Writes every figure to ``--json`` and plots ``--out`` (docs/img/state_sweep.png): each
figure's median against the MB moved, min-max bars, with the floor, each with its
least-squares line ``t = c + MB / rate`` over the sizes (the constant and rate in the legend).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt

from bench import metrics
from bench.config import BenchConfig, Scenario
from bench.plot import save_figure
from bench.probe import measure_broadcast
from bench.runner import JobResult, run_job
from bench.systems import TorchrelaySpare
from bench.workload import STATE_PREFIX, model_size
from bench.xfer_sweep import linear_fit

# One job per size; a 2 GB step takes seconds on 2 cores.
CONFIG = BenchConfig("state_sweep", (), run_timeout_s=900.0)
SERIES = {
    "stall_s": ("stall", "tab:red"),
    "first_step_s": ("kill -> first step", "tab:orange"),
    "transfer_s": ("transfer", "tab:blue"),
    "step_s": ("median step", "tab:green"),
    "floor_s": ("gloo broadcast (floor)", "tab:gray"),
}


def figures(mb: int, job: JobResult, floor_bytes_per_s: float) -> dict:
    """One size's row: the state's bytes (as the ledger counted them), and per kill each
    figure of the module doc, in seconds; the floor for the same bytes."""
    moved = [p.bytes_moved for p in job.phases]
    nbytes = statistics.median(moved) if moved else model_size(f"{STATE_PREFIX}{mb}").state_bytes
    return {
        "mb": mb,
        "bytes": nbytes,
        "stall_s": [i.stall_s for i in job.impacts],
        "first_step_s": [p.total for p in job.phases],
        "transfer_s": [p.transfer for p in job.phases],
        "step_s": [metrics.normal_interval(job.commits, t) for t in job.kill_times],
        "floor_s": [nbytes / floor_bytes_per_s],
    }


def measure(sizes: list[int], kills: tuple[int, ...], steps: int, workdir: Path) -> list[dict]:
    """Run the sweep; ``SystemExit`` with the job's error if one fails."""
    rows = []
    for mb in sizes:
        model = f"{STATE_PREFIX}{mb}"
        floor = measure_broadcast(model_size(model).state_bytes)
        scenario = Scenario(model, steps, kills, 1)
        job = run_job(TorchrelaySpare(), scenario, CONFIG, 0, True, workdir / model)
        if job.error:
            raise SystemExit(f"{mb} MB: {job.error}")
        row = figures(mb, job, floor)
        rows.append(row)
        shown = ", ".join(
            f"{label} {statistics.median(row[key]) * 1e3:.0f} ms"
            for key, (label, _) in SERIES.items()
        )
        print(f"{row['bytes'] / 1e6:.0f} MB: {shown}", flush=True)
    return rows


def fits(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Each figure's least-squares line over the sizes' medians: ``(constant s, MB/s)``."""
    mbs = [r["bytes"] / 1e6 for r in rows]
    found = {}
    for key in SERIES:
        c, k = linear_fit(mbs, [statistics.median(r[key]) for r in rows])
        found[key] = (c, 1 / k if k else float("inf"))
    return found


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    mbs = [r["bytes"] / 1e6 for r in rows]
    for key, (c, rate) in fits(rows).items():
        label, color = SERIES[key]
        medians = [statistics.median(r[key]) for r in rows]
        bars = [
            [m - min(r[key]) for m, r in zip(medians, rows, strict=True)],
            [max(r[key]) - m for m, r in zip(medians, rows, strict=True)],
        ]
        ax.errorbar(mbs, medians, yerr=bars, fmt="o", color=color, capsize=3)
        text = f"{label}: {c * 1e3:+.0f} ms + MB / {rate:.0f} MB/s"
        ax.plot([0, max(mbs)], [c, c + max(mbs) / rate], color=color, lw=1, label=text)
    ax.set_xlabel("state moved (MB of weights and AdamW state)")
    ax.set_ylabel("seconds (median over kills, min-max bars)")
    ax.set_title("a recovery against the state it moves (2 workers, 1 spare)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def table(rows: list[dict]) -> str:
    """Markdown: one row per size, each figure's median (min-max) in ms, then the fits."""
    head = "| MB | " + " | ".join(f"{label} ms" for label, _ in SERIES.values()) + " | kills |"
    lines = [head, "|" + "---|" * (len(SERIES) + 2)]
    for r in rows:
        cells = [
            f"{statistics.median(r[k]) * 1e3:.0f} ({min(r[k]) * 1e3:.0f}-{max(r[k]) * 1e3:.0f})"
            for k in SERIES
        ]
        lines.append(f"| {r['bytes'] / 1e6:.0f} | {' | '.join(cells)} | {len(r['stall_s'])} |")
    fitted = [
        f"{SERIES[k][0]} {c * 1e3:+.0f} ms + MB / {rate:.0f} MB/s"
        for k, (c, rate) in fits(rows).items()
    ]
    return "\n".join(lines) + "\n\nfits: " + "; ".join(fitted)


def _counts(text: str) -> list[int]:
    """A comma-separated list of positive integers, for argparse."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: not positive integers, comma-separated")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=_counts, default="15,100,250,500,1000", help="MB")
    parser.add_argument("--kills", type=_counts, default="40,80", help="steps")
    parser.add_argument("--steps", type=int, default=110)
    parser.add_argument("--json", type=Path, default=Path("docs/img/state_sweep.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/img/state_sweep.png"))
    parser.add_argument("--plot-only", action="store_true", help="replot --json")
    args = parser.parse_args()
    if args.plot_only:
        rows = json.loads(args.json.read_text())
    else:
        kills = tuple(args.kills)
        if max(kills) + metrics.LOST_AFTER > args.steps:
            raise SystemExit(
                f"--steps {args.steps}: the last kill needs {metrics.LOST_AFTER} steps after it"
            )
        with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
            rows = measure(args.sizes, kills, args.steps, Path(tmp))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    plot(rows, args.out)
    print(table(rows))


if __name__ == "__main__":
    main()
