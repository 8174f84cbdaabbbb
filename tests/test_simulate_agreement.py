"""The Monte Carlo and the closed form agree, and the Monte Carlo is reproducible.

Each case checks both strategies, so the grid makes several comparisons; each uses the
Monte Carlo's 95% interval widened to a family-wise 95% level (Bonferroni over the grid),
so a correct model fails this file with probability about 5% for an arbitrary seed, not
once in every few grids. Runs are long (1,000 days) so the start-of-run transient, an
O(interval / run length) effect, stays well inside the interval.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import pytest

from torchrelay.simulate import (
    Estimate,
    Model,
    Strategy,
    closed_form,
    monte_carlo,
    scenario_from_dict,
)
from torchrelay.simulate.montecarlo import Z_95
from torchrelay.simulate.settings import merge

LONG_RUN = {"simulation": {"replications": 60, "run_days": 1000, "seed": 0}}
NO_SHORTAGE = {"spares": {"count": 100_000}}  # the closed form is exact without blocking

GRID: dict[str, dict[str, Any]] = {
    "1k-vendor": {"preset": "claim-307k"},
    "4k-young-daly": {
        "cluster": {"gpus": 4096},
        "checkpoint": {"save_s": 120},
        "live": {"coverage": 0.9, "warning_share": 0.2, "overhead": 0.01},
    },
    "16k-partial-coverage": {
        "preset": "claim-16k",
        "live": {"coverage": 0.8, "warning_share": 0.3, "recovery_s": 120},
    },
    "16k-llama-mix": {
        "cluster": {"gpus": 16384},
        "failures": {"calibration": "llama3-405b", "mix": "llama3-405b"},
        "checkpoint": {"save_s": 60},
    },
    "4k-weibull-shape-1": {
        "cluster": {"gpus": 4096},
        "failures": {"process": "weibull", "weibull_shape": 1.0},
        "checkpoint": {"interval_h": 2.0, "save_s": 300},
    },
}
COMPARISONS = 2 * len(GRID)
Z_FAMILY = NormalDist().inv_cdf(1 - 0.05 / (2 * COMPARISONS))


def _agrees(sample: Estimate, value: float) -> bool:
    return abs(sample.mean - value) <= sample.half_width * Z_FAMILY / Z_95


@pytest.mark.parametrize("case", sorted(GRID))
def test_monte_carlo_agrees_with_exact_closed_form(case: str) -> None:
    scenario = scenario_from_dict(merge(merge(GRID[case], NO_SHORTAGE), LONG_RUN))
    exact, mc = closed_form(scenario), monte_carlo(scenario)
    for strategy in Strategy:
        predicted = getattr(exact, strategy.field)
        sampled = getattr(mc, strategy.field)
        assert _agrees(sampled.ettr, predicted.ettr), (strategy, predicted.ettr, sampled.ettr)
        assert _agrees(sampled.live_share, predicted.live_share), strategy
        assert _agrees(sampled.dollars_per_h, predicted.dollars_per_h), strategy
        assert sampled.ettr.half_width < 0.01  # the interval is informative, not vacuous


def test_monte_carlo_rejects_the_first_order_model_at_16k() -> None:
    """The agreement test can fail: the first-order ETTR lies far outside the interval."""
    scenario = scenario_from_dict(merge({"preset": "claim-16k"}, LONG_RUN))
    sampled = monte_carlo(scenario).checkpoint_restart.ettr
    first_order = closed_form(scenario, Model.FIRST_ORDER).checkpoint_restart.ettr
    assert not sampled.contains(first_order)
    assert sampled.mean - first_order > 0.1


DRY_POOL = {
    "cluster": {"gpus": 16384},
    "failures": {"mix": "llama3-405b"},
    "checkpoint": {"save_s": 60},
    "live": {"coverage": 1.0},
    "spares": {"count": 24, "repair_h": 12.0},
}


def test_spare_pool_blocking_matches_kaufman_roberts() -> None:
    scenario = scenario_from_dict(merge(DRY_POOL, LONG_RUN))
    predicted = closed_form(scenario).live_recovery
    sampled = monte_carlo(scenario).live_recovery
    curable = 350 / 419  # Llama 3 mix, coverage 1: without shortage all of these are live
    assert curable - predicted.live_share > 0.05  # the pool really runs dry here
    assert _agrees(sampled.live_share, predicted.live_share)


def test_dry_pool_closed_form_is_conservative() -> None:
    """With a pool that runs dry, rollbacks cluster in time and cost less rework than the
    closed form (which treats them as independent) charges: it errs low, by < 1 point."""
    scenario = scenario_from_dict(merge(DRY_POOL, LONG_RUN))
    predicted = closed_form(scenario).live_recovery.ettr
    sampled = monte_carlo(scenario).live_recovery.ettr
    assert predicted < sampled.low
    assert sampled.mean - predicted < 0.01


def test_monte_carlo_is_reproducible_and_seeded() -> None:
    settings = {"preset": "claim-16k", "simulation": {"replications": 10, "run_days": 10}}
    first = monte_carlo(scenario_from_dict(settings))
    again = monte_carlo(scenario_from_dict(settings))
    other = monte_carlo(scenario_from_dict(merge(settings, {"simulation": {"seed": 7}})))
    assert first == again
    assert first.checkpoint_restart.ettr != other.checkpoint_restart.ettr


def test_bursty_weibull_failures_help_rollbacks_and_hurt_the_pool() -> None:
    """Weibull shape < 1 clusters failures: a second failure soon after a rollback loses
    little, but a burst drains the spares. The MC sees both; the closed form cannot."""
    settings = {
        "preset": "claim-16k",
        "failures": {"process": "weibull", "weibull_shape": 0.7},
        "simulation": {"replications": 20, "run_days": 200},
    }
    scenario = scenario_from_dict(settings)
    exact, mc = closed_form(scenario), monte_carlo(scenario)
    assert mc.checkpoint_restart.ettr.low > exact.checkpoint_restart.ettr + 0.03
    assert mc.live_recovery.live_share.high < exact.live_recovery.live_share
