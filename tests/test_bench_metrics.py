"""The benchmark's metric definitions on hand-made progress logs (no processes, fast)."""

from __future__ import annotations

import math

import pytest
import torch

from bench import metrics
from bench.metrics import Commit, Kill


def steady(steps: range, t0: float, dt: float, participants: int = 2) -> list[Commit]:
    return [Commit(s, t0 + i * dt, participants) for i, s in enumerate(steps)]


def test_parse_progress_skips_torn_last_line() -> None:
    text = "0 10.0 2\n1 10.1 2\n2 10."
    assert metrics.parse_progress(text) == [Commit(0, 10.0, 2), Commit(1, 10.1, 2)]


def test_parse_kill_marker() -> None:
    assert metrics.parse_kill_marker("80 81 1234.5\n") == Kill(81, 1234.5)


def test_steady_rate_skips_startup() -> None:
    commits = [Commit(0, 0.0, 2), Commit(1, 5.0, 2), *steady(range(2, 102), 6.0, 0.1)]
    assert metrics.steady_rate(commits) == pytest.approx(10.0)


def test_hot_spare_like_recovery() -> None:
    """Kill inside step 50, the same step commits 0.3 s later, normal pace after."""
    commits = steady(range(50), 0.0, 0.1) + steady(range(50, 80), 5.2, 0.1)
    impact = metrics.failure_impact(commits, Kill(50, 4.95), world=2, batch=8)
    assert impact.stall_s == pytest.approx(0.25)
    assert impact.resume_s == pytest.approx(0.25)
    assert impact.degraded_s == pytest.approx(0.25)
    assert (impact.lost_steps, impact.recomputed_steps, impact.samples_dropped) == (0, 1, 0)
    # Step 50 commits 0.2 s late (5.2, not 5.0), and every step after it at the normal pace.
    assert impact.time_lost_s == pytest.approx(0.2)


def test_rollback_counts_lost_and_recomputed_steps_inside_the_stall() -> None:
    """Checkpoint at 39, kill in step 50: steps 40..49 are lost and redone."""
    commits = steady(range(50), 0.0, 0.1) + steady(range(40, 80), 8.0, 0.1)
    impact = metrics.failure_impact(commits, Kill(50, 4.95), world=2, batch=8)
    assert impact.lost_steps == 10
    assert impact.recomputed_steps == 11  # the 10 redone + the one in flight
    assert impact.stall_s == pytest.approx(8.0 + 1.0 - 4.95)  # step 50 committed at 9.0


def test_rank0_committing_the_step_before_the_kill_late_is_not_a_new_step() -> None:
    """The victim dies starting step 50 at t=4.95; rank 0 logs step 49 at 4.96, then rolls
    back to 40: 10 committed steps lost, not 9."""
    commits = [*steady(range(49), 0.0, 0.1), Commit(49, 4.96, 2), *steady(range(40, 80), 8.0, 0.1)]
    impact = metrics.failure_impact(commits, Kill(50, 4.95), world=2, batch=8)
    assert impact.lost_steps == 10
    assert impact.resume_s == pytest.approx(9.0 - 4.95)


def test_degraded_replicas_count_dropped_samples_and_separate_degraded_time() -> None:
    """torchft-like: 1 s until the survivor commits alone, rejoin at step 70."""
    commits = (
        steady(range(50), 0.0, 0.1)
        + steady(range(50, 70), 6.0, 0.05, participants=1)
        + steady(range(70, 120), 7.5, 0.1)
    )
    impact = metrics.failure_impact(commits, Kill(50, 4.95), world=2, batch=8)
    assert impact.stall_s == pytest.approx(1.05)
    assert impact.degraded_s == pytest.approx(7.5 - 4.95)
    assert impact.samples_dropped == 20 * 8
    assert impact.lost_steps == 0
    # Taken once the job is whole again: step 70 at 7.5, where a failure-free run is at 7.0.
    assert impact.time_lost_s == pytest.approx(0.5)


def test_a_slow_step_right_after_resuming_extends_the_stall() -> None:
    commits = [
        *steady(range(50), 0.0, 0.1),
        Commit(50, 5.1, 2),
        Commit(51, 7.0, 2),
        *steady(range(52, 70), 7.1, 0.1),
    ]
    impact = metrics.failure_impact(commits, Kill(50, 4.95), world=2, batch=8)
    assert impact.stall_s == pytest.approx(7.0 - 4.95)
    assert impact.resume_s == pytest.approx(5.1 - 4.95)


def test_slow_steps_after_the_stall_count_in_the_time_lost_not_in_the_stall() -> None:
    """Step 50 commits 0.2 s late; the next four take 0.15 s each instead of 0.1 (a refill
    spare starting beside the workers): within the stall's tolerance, but 0.2 s more lost."""
    commits = [
        *steady(range(50), 0.0, 0.1),
        *steady(range(50, 55), 5.2, 0.15),
        *steady(range(55, 90), 5.2 + 4 * 0.15 + 0.1, 0.1),
    ]
    impact = metrics.failure_impact(commits, Kill(50, 4.95), world=2, batch=8)
    assert impact.stall_s == pytest.approx(0.25)
    assert impact.time_lost_s == pytest.approx(0.2 + 4 * 0.05)


def test_time_lost_needs_its_window_of_new_steps_before_the_next_kill() -> None:
    commits = steady(range(100), 0.0, 0.1)
    near, far = metrics.all_failures(commits, [Kill(21, 2.05), Kill(40, 4.0)], world=2, batch=8)
    assert math.isnan(near.time_lost_s)  # 19 new steps before the next kill
    assert far.time_lost_s == pytest.approx(0.0)


def test_all_failures_bounds_each_window_by_the_next_kill() -> None:
    commits = steady(range(100), 0.0, 0.1)
    impacts = metrics.all_failures(commits, [Kill(71, 7.05), Kill(21, 2.05)], world=2, batch=8)
    assert [round(i.stall_s, 3) for i in impacts] == [0.05, 0.05]
    assert metrics.all_failures(commits, [], world=2, batch=8) == []


def test_no_commit_after_kill_gives_nan_stall() -> None:
    impact = metrics.failure_impact(steady(range(10), 0.0, 0.1), Kill(10, 5.0), world=2, batch=1)
    assert math.isnan(impact.stall_s)


def test_compare_weights() -> None:
    a = {"w": torch.ones(3), "b": torch.zeros(2)}
    assert metrics.compare_weights(a, {k: v.clone() for k, v in a.items()}) == (True, 0.0)
    b = {"w": torch.tensor([1.0, 1.5, 1.0]), "b": torch.zeros(2)}
    assert metrics.compare_weights(a, b) == (False, 0.5)
    assert metrics.compare_weights(a, {"w": torch.ones(3)}) == (False, math.inf)


def test_spread_ignores_nan() -> None:
    assert metrics.spread([3.0, math.nan, 1.0, 2.0]) == metrics.Spread(2.0, 1.0, 3.0, 3)
    assert metrics.spread([]).n == 0


def test_recovery_phases() -> None:
    event = {
        "timeline": {
            "detected": 10.01,
            "spare_ready": 10.011,
            "halted": 10.012,
            "planned": 10.02,
            "comm_ready": 10.03,
            "transfer_done": 10.08,
            "first_step": 10.1,
        },
        "bytes_transferred": 5_000_000,
    }
    p = metrics.recovery_phases(event, kill_t=10.0)
    assert (p.detect, p.plan, p.communicator, p.transfer, p.first_step, p.total) == pytest.approx(
        (0.01, 0.01, 0.01, 0.05, 0.02, 0.1)
    )
    assert p.transfer_bytes_per_s == pytest.approx(1e8)


def test_a_difference_of_medians_is_resolved_only_beyond_the_samples_noise() -> None:
    noise = [(-1) ** i * (i % 7) * 1e-3 for i in range(15)]  # +-6 ms around each level
    base = [0.060 + n for n in noise]
    same = metrics.median_difference([0.060 + n for n in reversed(noise)], base)
    assert same.median == 0.0 and same.lo <= 0.0 <= same.hi and not same.resolved
    slower = metrics.median_difference([0.080 + n for n in noise], base)
    assert slower.resolved and slower.lo <= 0.020 <= slower.hi
    assert metrics.median_difference([0.080 + n for n in noise], base) == slower  # seeded
    assert math.isnan(metrics.median_difference([], base).median)


def test_after_the_stall_each_step_is_timed_against_the_pace_before_the_kill() -> None:
    """Step 50 ends the stall (it commits 0.2 s late); the next steps take 0.2, 0.15, 0.1 s."""
    gaps = [0.2, 0.15, *[0.1] * 20]
    after = [Commit(50, 5.2, 2)]
    for step, gap in enumerate(gaps, start=51):
        after.append(Commit(step, after[-1].t + gap, 2))
    commits = [*steady(range(50), 0.0, 0.1), *after]
    [impact] = metrics.all_failures(commits, [Kill(50, 4.95)], world=2, batch=8)
    assert impact.stall_s == pytest.approx(0.25)
    [ratios] = metrics.all_after_stall(commits, [Kill(50, 4.95)], [impact])
    assert ratios == pytest.approx([2.0, 1.5, *[1.0] * 8])  # metrics.AFTER_STALL of them
    # Bounded by the next kill (at 5.6, before step 53 commits); none where no stall ended.
    assert metrics.after_stall(commits, Kill(50, 4.95), 0.25, until=5.6) == pytest.approx([2, 1.5])
    assert metrics.after_stall(commits, Kill(50, 4.95), math.nan) == []


def test_after_the_stall_stops_at_a_step_committed_again() -> None:
    commits = [*steady(range(50), 0.0, 0.1), *steady(range(50, 53), 5.2, 0.1), Commit(52, 5.6, 2)]
    assert metrics.after_stall(commits, Kill(50, 4.95), 0.25) == pytest.approx([1.0, 1.0])
