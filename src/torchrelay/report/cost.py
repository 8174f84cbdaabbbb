"""The cost view: what ``torchrelay simulate --from-run RUN_DIR --gpus N`` projects for a run.

The run's measured live recovery (median recovery time, share of failures recovered with zero
lost steps, overhead) replaces the simulator's live-recovery defaults; everything else (MTTF
calibration, checkpoint interval, restart time, price, spare pool) is the simulator's default
scenario, re-evaluated at each size in :data:`SIZES`. Only the simulate package's public
functions are used, so this view and the command line cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from torchrelay.simulate import (
    ClosedForm,
    RunMeasurement,
    ScenarioError,
    closed_form,
    measure_run,
    scenario_from_dict,
)

SIZES = (1024, 16384)
"""Cluster sizes (GPUs) the report projects the run to."""


@dataclass(frozen=True)
class CostView:
    """The run's measurement and the exact closed form at each of :data:`SIZES`."""

    measurement: RunMeasurement
    price_per_gpu_h: float
    projections: tuple[ClosedForm, ...]


def project(run_dir: Path, sizes: tuple[int, ...] = SIZES) -> CostView:
    """Project ``run_dir``'s measured recovery to each of ``sizes``.

    Raises ``ScenarioError`` when the run cannot be measured (no ledger, or no failure, so
    no coverage) or a measured figure is out of the simulator's range.
    """
    base = scenario_from_dict({})
    measurement = measure_run(run_dir, default_overhead=base.live.overhead)
    try:
        live = measurement.applied_to(base.live)
    except ScenarioError as err:
        raise ScenarioError(f"measured {err}") from None
    projections = tuple(
        closed_form(replace(scenario_from_dict({"cluster": {"gpus": gpus}}), live=live))
        for gpus in sizes
    )
    return CostView(measurement, base.cluster.price_per_gpu_h, projections)
