"""What each strategy does when the job is interrupted, resolved from a Scenario into hours.

Both engines read only a ``StrategyPlan``, so they share every input (failure rate, spare
pool, blocking, checkpoint interval) and can differ only in their mathematics, which is what
the agreement tests check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from torchrelay.simulate.params import Scenario
from torchrelay.simulate.spares import blocking, smallest_pool


class Strategy(str, Enum):
    """The two ways of surviving an interruption that the simulator compares."""

    CHECKPOINT_RESTART = "checkpoint-restart"
    LIVE_RECOVERY = "live-recovery"

    @property
    def field(self) -> str:
        """The attribute that holds this strategy's result on ClosedForm and MonteCarlo."""
        return self.value.replace("-", "_")


@dataclass(frozen=True)
class ClassPlan:
    """One failure class as a strategy sees it: normalised share of interruptions, GPUs lost,
    whether spares can cure it, and the probability its event finds too few free spares."""

    name: str
    share: float
    gpus: int
    curable: bool
    blocking: float


@dataclass(frozen=True)
class StrategyPlan:
    """A strategy's resolved parameters, all times in hours.

    An interruption of class i is handled live with probability ``eligibility(i) * (1 -
    blocking_i)``; otherwise it falls back to checkpoint-restart. ``interval_h`` is infinite
    when no failure can force a rollback and no interval was given.
    """

    strategy: Strategy
    gpus: int
    price_per_gpu_h: float
    failure_rate_h: float
    classes: tuple[ClassPlan, ...]
    warning_share: float
    coverage: float
    interval_h: float
    save_h: float
    restart_h: float
    pause_h: float
    overhead: float
    pool: int
    repair_h: float
    idle_spares: int
    borrow_cost_gpu_h: float

    def eligibility(self, cls: ClassPlan) -> float:
        """Probability a ``cls`` event would be handled live given enough spares: warned in
        time (proactive migration) or cured by live recovery; zero if not curable."""
        if not cls.curable:
            return 0.0
        return self.warning_share + (1 - self.warning_share) * self.coverage

    @property
    def live_share(self) -> float:
        """Long-run share of interruptions handled live (the rest roll back)."""
        return sum(c.share * self.eligibility(c) * (1 - c.blocking) for c in self.classes)

    @property
    def hard_rate_h(self) -> float:
        """Interruptions per hour that roll back to the last checkpoint."""
        return self.failure_rate_h * (1 - self.live_share)

    @property
    def live_rate_h(self) -> float:
        """Interruptions per hour handled live."""
        return self.failure_rate_h * self.live_share

    @property
    def segment_h(self) -> float:
        """Wall time of one checkpoint interval plus its save."""
        return self.interval_h + self.save_h

    @property
    def borrowed_gpus_per_h(self) -> float:
        """Spare GPUs taken per hour, long-run."""
        return self.failure_rate_h * sum(
            c.share * self.eligibility(c) * (1 - c.blocking) * c.gpus for c in self.classes
        )

    def spare_cost_per_h(self, borrowed_gpus_per_h: float) -> float:
        """Dollars per hour the spares cost: the idle pool, plus the lower-priority work lost
        for each borrowed GPU."""
        gpu_h = self.idle_spares + self.borrow_cost_gpu_h * borrowed_gpus_per_h
        return gpu_h * self.price_per_gpu_h

    def dollars_per_h(self, ettr: float, borrowed_gpus_per_h: float) -> float:
        """Dollars lost per hour: training time not kept, at the GPU price, plus spares."""
        lost = (1 - ettr) * self.gpus * self.price_per_gpu_h
        return lost + self.spare_cost_per_h(borrowed_gpus_per_h)


def _young_daly(save_h: float, rollback_rate_h: float) -> float:
    # First-order optimum sqrt(2 * save * MTTF) over the failures that force a rollback.
    return math.sqrt(2 * save_h / rollback_rate_h) if rollback_rate_h > 0 else math.inf


def plans(scenario: Scenario) -> dict[Strategy, StrategyPlan]:
    """The two strategies' plans for ``scenario``: checkpoint-restart and live recovery."""
    rate = 1.0 / scenario.mttf_h
    classes = scenario.failures.classes()
    total = sum(c.weight for c in classes)
    baseline = tuple(ClassPlan(c.name, c.weight / total, c.gpus, c.curable, 0.0) for c in classes)
    save_h = scenario.checkpoint.save_s / 3600
    common = {
        "gpus": scenario.cluster.gpus,
        "price_per_gpu_h": scenario.cluster.price_per_gpu_h,
        "failure_rate_h": rate,
        "save_h": save_h,
        "restart_h": scenario.restart.total_s / 3600,
        "repair_h": scenario.spares.repair_h,
    }
    interval = scenario.checkpoint.interval_h
    checkpoint = StrategyPlan(
        strategy=Strategy.CHECKPOINT_RESTART,
        classes=baseline,
        warning_share=0.0,
        coverage=0.0,
        interval_h=interval or _young_daly(save_h, rate),
        pause_h=0.0,
        overhead=0.0,
        pool=0,
        idle_spares=0,
        borrow_cost_gpu_h=0.0,
        **common,
    )
    live_settings, spares = scenario.live, scenario.spares
    unpooled = StrategyPlan(
        strategy=Strategy.LIVE_RECOVERY,
        classes=baseline,
        warning_share=live_settings.warning_share,
        coverage=live_settings.coverage,
        interval_h=math.inf,
        pause_h=live_settings.recovery_s / 3600,
        overhead=live_settings.overhead,
        pool=0,
        idle_spares=0,
        borrow_cost_gpu_h=spares.preempt_gpu_h if spares.source == "borrowed" else 0.0,
        **common,
    )
    loads = [(rate * c.share * unpooled.eligibility(c) * spares.repair_h, c.gpus) for c in baseline]
    pool = spares.count
    if pool is None:
        pool = smallest_pool(loads, spares.target_blocking, limit=scenario.cluster.gpus)
    blocked = blocking(loads, pool)
    pooled = tuple(
        ClassPlan(c.name, c.share, c.gpus, c.curable, b)
        for c, b in zip(baseline, blocked, strict=True)
    )
    live = replace(
        unpooled,
        classes=pooled,
        pool=pool,
        idle_spares=pool if spares.source == "idle" else 0,
    )
    # The interval depends on the rollback rate, which depends on blocking: resolve it last.
    live = replace(live, interval_h=interval or _young_daly(save_h, live.hard_rate_h))
    return {Strategy.CHECKPOINT_RESTART: checkpoint, Strategy.LIVE_RECOVERY: live}
