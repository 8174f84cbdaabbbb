"""Presenting results: a rich table, a JSON document, and the ETTR-versus-size plot."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from torchrelay.simulate.analytic import ClosedForm, Model, StrategyOutcome
from torchrelay.simulate.measured import RunMeasurement
from torchrelay.simulate.montecarlo import MonteCarlo, StrategySample
from torchrelay.simulate.params import HOURS_PER_MONTH, HOURS_PER_YEAR, Scenario
from torchrelay.simulate.plan import Strategy
from torchrelay.simulate.scaling import method
from torchrelay.simulate.sweep import SweepPoint

_BLOCKING_NOTE = 0.01  # above this, rollbacks cluster and the closed form turns conservative


@dataclasses.dataclass(frozen=True)
class Results:
    """Everything one ``simulate`` invocation computed for one scenario."""

    scenario: Scenario
    exact: ClosedForm
    first_order: ClosedForm
    monte_carlo: MonteCarlo | None
    measurement: RunMeasurement | None

    def closed_form(self, model: Model) -> ClosedForm:
        """The closed form for ``model``."""
        return self.exact if model is Model.EXACT else self.first_order


def _plain(value: Any) -> Any:
    """JSON-safe copy: dataclasses to dicts, enums and paths to strings, inf/nan to None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _outcome_dict(outcome: StrategyOutcome) -> dict[str, Any]:
    data = _plain(outcome)
    data["dollars_per_month"] = outcome.dollars_per_month
    data["dollars_per_year"] = outcome.dollars_per_year
    return data


def to_dict(results: Results) -> dict[str, Any]:
    """The whole result as plain JSON types; infinite intervals (no checkpoints) are null."""
    scenario = results.scenario
    closed = {
        form.model.value: {s.value: _outcome_dict(getattr(form, s.field)) for s in Strategy}
        for form in (results.exact, results.first_order)
    }
    points = scenario.failures.points(scenario.cluster.gpus)
    return {
        "scenario": _plain(scenario),
        "mttf_h": scenario.mttf_h,
        "mttf_method": method(points, scenario.cluster.gpus),
        "closed_form": closed,
        "monte_carlo": _plain(results.monte_carlo),
        "measured_run": _plain(results.measurement),
    }


def _money(dollars: float) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(dollars) >= scale:
            return f"${dollars / scale:,.2f}{suffix}"
    return f"${dollars:,.0f}"


def _hours(value: float) -> str:
    return "none" if math.isinf(value) else f"{value:.2f} h"


def _mc_cell(sample: StrategySample | None) -> str:
    if sample is None:
        return "not run"
    return f"{sample.ettr.mean:.2%} ± {sample.ettr.half_width:.2%}"


def print_report(console: Console, results: Results, model: Model) -> None:
    """One column per strategy: ETTR under both closed forms and the Monte Carlo, and the
    dollars lost under ``model``; then notes on where the closed form is approximate."""
    scenario, mc = results.scenario, results.monte_carlo
    gpus, points = scenario.cluster.gpus, scenario.failures.points(scenario.cluster.gpus)
    console.print(
        f"[bold]{gpus:,} GPUs[/] at ${scenario.cluster.price_per_gpu_h:.2f}/GPU-h, "
        f"job MTTF {scenario.mttf_h:.2f} h ({method(points, gpus)}), "
        f"{scenario.failures.process} failures"
    )
    chosen = results.closed_form(model)
    per = {s: (getattr(results.exact, s.field), getattr(chosen, s.field)) for s in Strategy}
    table = Table(title="Effective training time ratio (ETTR) and cost of failures")
    table.add_column("")
    for strategy in Strategy:
        table.add_column(strategy.value, justify="right")
    table.add_column("saved", justify="right", style="bold green")
    cells = {
        "ETTR (exact)": [f"{e.ettr:.2%}" for e, _ in per.values()],
        "ETTR (first-order)": [
            f"{getattr(results.first_order, s.field).ettr:.2%}" for s in Strategy
        ],
        "ETTR (MC, 95% CI)": [_mc_cell(getattr(mc, s.field) if mc else None) for s in Strategy],
        "checkpoint every": [_hours(e.interval_h) for e, _ in per.values()],
        "handled live": [f"{e.live_share:.1%}" for e, _ in per.values()],
        "spare GPUs": [str(e.spare_gpus) for e, _ in per.values()],
    }
    for label, row in cells.items():
        table.add_row(label, *row, "")
    saved_per_h = chosen.checkpoint_restart.dollars_per_h - chosen.live_recovery.dollars_per_h
    for label, hours in (("month", HOURS_PER_MONTH), ("year", HOURS_PER_YEAR)):
        table.add_row(
            f"$ lost/{label} ({model.value})",
            *(_money(c.dollars_per_h * hours) for _, c in per.values()),
            _money(saved_per_h * hours),
        )
    console.print(table)
    for note in _notes(results):
        console.print(f"[dim]note:[/] {note}")


def _notes(results: Results) -> list[str]:
    notes = []
    scenario, measurement = results.scenario, results.measurement
    if measurement is not None:
        source = "bench event" if measurement.overhead_measured else "--overhead"
        recovery = "-" if measurement.recovery_s is None else f"{measurement.recovery_s:.1f} s"
        notes.append(
            f"from {measurement.run_dir}: {measurement.failures} failures, "
            f"{measurement.lossless_recoveries} lossless recoveries -> coverage "
            f"{measurement.coverage:.0%}, median recovery {recovery}, "
            f"overhead {measurement.overhead:.1%} ({source})"
        )
    if scenario.failures.process == "weibull" and scenario.failures.weibull_shape != 1:
        notes.append("closed forms assume Poisson failures; trust the Monte Carlo for Weibull")
    mc = results.monte_carlo
    if mc is not None and mc.live_recovery.blocked_share.mean > _BLOCKING_NOTE:
        notes.append(
            f"{mc.live_recovery.blocked_share.mean:.1%} of failures found the spare pool short: "
            "those rollbacks cluster in time, which the closed form treats as independent, so "
            "it understates live-recovery ETTR; trust the Monte Carlo"
        )
    return notes


def plot_ettr(points: Sequence[SweepPoint], path: Path, title: str) -> None:
    """ETTR versus cluster size for both strategies: exact closed form (solid), first-order
    (dashed), Monte Carlo 95% intervals (markers), written as a PNG with the Agg backend."""
    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    sizes = [p.gpus for p in points]
    colors = {Strategy.CHECKPOINT_RESTART: "tab:red", Strategy.LIVE_RECOVERY: "tab:blue"}
    for strategy, color in colors.items():
        field, label = strategy.field, strategy.value
        exact = [getattr(p.exact, field).ettr for p in points]
        first = [getattr(p.first_order, field).ettr for p in points]
        axes.plot(sizes, exact, color=color, label=f"{label} (exact)")
        axes.plot(sizes, first, color=color, linestyle="--", label=f"{label} (first-order)")
        sampled = [(p.gpus, getattr(p.monte_carlo, field).ettr) for p in points if p.monte_carlo]
        if sampled:
            axes.errorbar(
                [g for g, _ in sampled],
                [e.mean for _, e in sampled],
                yerr=[e.half_width for _, e in sampled],
                fmt="o",
                color=color,
                capsize=3,
                label=f"{label} (Monte Carlo)",
            )
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [f"{s:,}" for s in sizes], rotation=45)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("cluster size (GPUs)")
    axes.set_ylabel("effective training time ratio")
    axes.set_title(title, fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="lower left")
    figure.tight_layout()
    figure.savefig(path)
