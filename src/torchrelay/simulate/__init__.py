"""``torchrelay simulate``: what failures cost at cluster scale, checkpoint-restart versus live
recovery, as effective training time ratio (ETTR) and dollars.

Python API::

    from torchrelay.simulate import Scenario, closed_form, monte_carlo, scenario_from_dict

    scenario = scenario_from_dict({"preset": "claim-16k"})
    exact = closed_form(scenario)              # Model.EXACT; Model.FIRST_ORDER for vendor math
    mc = monte_carlo(scenario)                 # seeded; Estimate(mean, half_width) per figure
    assert mc.checkpoint_restart.ettr.contains(exact.checkpoint_restart.ettr)
"""

from torchrelay.simulate.analytic import ClosedForm, Model, StrategyOutcome, closed_form
from torchrelay.simulate.errors import ScenarioError
from torchrelay.simulate.measured import RunMeasurement, measure_run
from torchrelay.simulate.montecarlo import Estimate, MonteCarlo, StrategySample, monte_carlo
from torchrelay.simulate.params import (
    HOURS_PER_MONTH,
    HOURS_PER_YEAR,
    CalibrationPoint,
    Checkpointing,
    Cluster,
    FailureClass,
    Failures,
    LiveRecovery,
    Restart,
    Scenario,
    Simulation,
    Spares,
    load_scenario,
    scenario_from_dict,
)
from torchrelay.simulate.plan import Strategy
from torchrelay.simulate.sweep import SweepPoint, sweep

__all__ = [
    "HOURS_PER_MONTH",
    "HOURS_PER_YEAR",
    "CalibrationPoint",
    "Checkpointing",
    "ClosedForm",
    "Cluster",
    "Estimate",
    "FailureClass",
    "Failures",
    "LiveRecovery",
    "Model",
    "MonteCarlo",
    "Restart",
    "RunMeasurement",
    "Scenario",
    "ScenarioError",
    "Simulation",
    "Spares",
    "Strategy",
    "StrategyOutcome",
    "StrategySample",
    "SweepPoint",
    "closed_form",
    "load_scenario",
    "measure_run",
    "monte_carlo",
    "scenario_from_dict",
    "sweep",
]
