"""``torchrelay simulate``: what failures cost at cluster scale, checkpoint-restart versus live
recovery, as effective training time ratio (ETTR) and dollars.

Python API::

    from torchrelay.simulate import Scenario, closed_form, monte_carlo, scenario_from_dict

    scenario = scenario_from_dict({"preset": "claim-16k"})
    exact = closed_form(scenario)              # Model.EXACT; Model.FIRST_ORDER for vendor math
    mc = monte_carlo(scenario)                 # seeded; Estimate(mean, half_width) per figure
    assert mc.checkpoint_restart.ettr.contains(exact.checkpoint_restart.ettr)
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives; imported on first use, so that ``torchrelay simulate --help``
# (and every other torchrelay command) does not pay for numpy and matplotlib.
_LAZY = {
    "CalibrationPoint": "params",
    "Checkpointing": "params",
    "ClosedForm": "analytic",
    "Cluster": "params",
    "Estimate": "montecarlo",
    "FailureClass": "params",
    "Failures": "params",
    "HOURS_PER_MONTH": "params",
    "HOURS_PER_YEAR": "params",
    "LiveRecovery": "params",
    "Model": "analytic",
    "MonteCarlo": "montecarlo",
    "Restart": "params",
    "RunMeasurement": "measured",
    "Scenario": "params",
    "ScenarioError": "errors",
    "Simulation": "params",
    "Spares": "params",
    "Strategy": "plan",
    "StrategyOutcome": "analytic",
    "StrategySample": "montecarlo",
    "SweepPoint": "sweep",
    "closed_form": "analytic",
    "load_scenario": "settings",
    "measure_run": "measured",
    "monte_carlo": "montecarlo",
    "scenario_from_dict": "settings",
    "sweep": "sweep",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"torchrelay.simulate.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'torchrelay.simulate' has no attribute {name!r}")
