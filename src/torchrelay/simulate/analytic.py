"""Closed-form effective training time ratio (ETTR) and dollars lost, per strategy.

Two models over the same ``StrategyPlan``:

* ``Model.EXACT``: the long-run ETTR of the event model the Monte Carlo simulates, derived
  by renewal-reward for Poisson interruptions (see ``ettr_exact``). Exact when spares never
  run out; with a finite pool it treats blocking as independent between events.
* ``Model.FIRST_ORDER``: the back-of-the-envelope accounting vendor claims use: every
  interruption per wall-clock hour costs restart + half an interval of rework (Young 1974).
  Accurate only when failures are rare relative to the interval; clipped at zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from torchrelay.simulate.params import HOURS_PER_MONTH, HOURS_PER_YEAR, Scenario
from torchrelay.simulate.plan import Strategy, StrategyPlan, plans


class Model(str, Enum):
    """Which closed form to evaluate."""

    EXACT = "exact"
    FIRST_ORDER = "first-order"


def ettr_exact(plan: StrategyPlan) -> float:
    """Long-run share of wall-clock time that ends up as kept training progress.

    With interruption rate L split into live (rate a) and rollback (rate h) events, live
    pause r, restart R, interval tau and save delta (segment T = tau + delta), overhead o:

        ETTR = (1 - o) * (tau / T) * (s T / (e^{sT} - 1)) * u / (1 + h * D)

    where u = (h + a e^{-L r}) / L is the running share of up-time (a live pause restarts if
    another live event lands in it), s = h / u is the rollback rate per hour of running, and
    D = (e^{L R} - 1) / L is the expected restart time when any failure restarts the restart.
    """
    rate, hard, live = plan.failure_rate_h, plan.hard_rate_h, plan.live_rate_h
    running_share = (hard + live * math.exp(-rate * plan.pause_h)) / rate
    save_factor = 1.0 if math.isinf(plan.interval_h) else plan.interval_h / plan.segment_h
    if hard == 0:
        rework_factor = 1.0
    elif math.isinf(plan.segment_h):
        rework_factor = 0.0  # rollbacks happen but nothing is ever saved
    else:
        exponent = hard / running_share * plan.segment_h
        rework_factor = exponent / math.expm1(exponent)
    downtime_h = math.expm1(rate * plan.restart_h) / rate
    return (
        (1 - plan.overhead) * save_factor * rework_factor * running_share / (1 + hard * downtime_h)
    )


def ettr_first_order(plan: StrategyPlan) -> float:
    """1 - o - delta/tau - h (R + tau/2) - a r, clipped at 0 where the linearisation fails."""
    save_share = 0.0 if math.isinf(plan.interval_h) else plan.save_h / plan.interval_h
    rollback_h = 0.0 if plan.hard_rate_h == 0 else plan.restart_h + plan.interval_h / 2
    lost = (
        plan.overhead + save_share + plan.hard_rate_h * rollback_h + plan.live_rate_h * plan.pause_h
    )
    return max(0.0, 1 - lost)


@dataclass(frozen=True)
class StrategyOutcome:
    """One strategy's long-run figures; dollars are lost training time at the GPU price plus
    what the spares cost."""

    strategy: Strategy
    ettr: float
    failures_per_h: float
    live_share: float
    interval_h: float
    spare_gpus: int
    lost_gpu_h_per_h: float
    spare_cost_per_h: float
    dollars_per_h: float

    @property
    def dollars_per_month(self) -> float:
        """Dollars lost per average month (730 h)."""
        return self.dollars_per_h * HOURS_PER_MONTH

    @property
    def dollars_per_year(self) -> float:
        """Dollars lost per year (8,760 h)."""
        return self.dollars_per_h * HOURS_PER_YEAR


@dataclass(frozen=True)
class ClosedForm:
    """Both strategies under one closed-form model, at one cluster size."""

    model: Model
    gpus: int
    mttf_h: float
    checkpoint_restart: StrategyOutcome
    live_recovery: StrategyOutcome


def _outcome(plan: StrategyPlan, ettr: float) -> StrategyOutcome:
    borrowed = plan.borrowed_gpus_per_h
    return StrategyOutcome(
        strategy=plan.strategy,
        ettr=ettr,
        failures_per_h=plan.failure_rate_h,
        live_share=plan.live_share,
        interval_h=plan.interval_h,
        spare_gpus=plan.pool,
        lost_gpu_h_per_h=(1 - ettr) * plan.gpus,
        spare_cost_per_h=plan.spare_cost_per_h(borrowed),
        dollars_per_h=plan.dollars_per_h(ettr, borrowed),
    )


def closed_form(scenario: Scenario, model: Model = Model.EXACT) -> ClosedForm:
    """ETTR and dollars for both strategies of ``scenario`` under ``model``."""
    evaluate = ettr_exact if Model(model) is Model.EXACT else ettr_first_order
    resolved = plans(scenario)
    results = {strategy: _outcome(plan, evaluate(plan)) for strategy, plan in resolved.items()}
    return ClosedForm(
        model=Model(model),
        gpus=scenario.cluster.gpus,
        mttf_h=scenario.mttf_h,
        checkpoint_restart=results[Strategy.CHECKPOINT_RESTART],
        live_recovery=results[Strategy.LIVE_RECOVERY],
    )
