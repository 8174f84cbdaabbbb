"""``bench_progress.png``: committed step vs wall time, all systems, same failures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or this machine
import matplotlib.pyplot as plt

from bench.runner import BenchResults, JobResult
from bench.systems import SYSTEMS

COLORS = {
    "ddp": "tab:gray",
    "torchrun_ckpt": "tab:red",
    "torchft": "tab:orange",
    "torchrelay": "tab:blue",
}
LABELS = {
    "ddp": "plain DDP (no failure)",
    "torchrun_ckpt": "torchrun + checkpoint",
    "torchft": "torchft",
    "torchrelay": "torchrelay + hot spare",
}


def save_figure(fig: plt.Figure, path: Path) -> None:
    """Grid every panel of ``fig``, lay it out, write it to ``path`` (making its folder) and
    close it."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _example(results: BenchResults, system: str, model: str) -> JobResult | None:
    """The first finished job of ``system`` with failures (plain DDP: without)."""
    jobs = results.find(system, model, failures=system != "ddp")
    return next((j for j in jobs if j.error is None and j.commits), None)


def plot_progress(results: BenchResults, path: Path) -> None:
    """One panel per model; x = seconds since the job's first committed step."""
    models = [s.model for s in results.config.scenarios]
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.6), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for system in SYSTEMS:
            job = _example(results, system, model)
            if job is None:
                continue
            t0 = job.start_t
            ax.plot(
                [c.t - t0 for c in job.commits],
                [c.step for c in job.commits],
                color=COLORS[system],
                label=LABELS[system],
                lw=1.4,
                drawstyle="steps-post",
            )  # flat while stalled, then the rollback drop
            for kill in job.kill_times:
                ax.axvline(kill - t0, color=COLORS[system], ls=":", lw=0.9)
        ax.set_title(f"{model} model: committed step vs time (dotted: SIGKILLs)")
        ax.set_xlabel("seconds since first committed step")
        ax.set_ylabel("committed step (rank 0)")
        ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)
