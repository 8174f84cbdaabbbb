"""The figures of ``python -m bench.spare_side`` from a job's ledger, progress and template log."""

from __future__ import annotations

import pytest

from bench import metrics
from bench.spare_side import (
    VariantFigures,
    detect_ms,
    first_step_ratios,
    render,
    span,
    start_s,
)


def _commits(times: list[float]) -> list[metrics.Commit]:
    return [metrics.Commit(step, t, 2) for step, t in enumerate(times)]


def test_first_step_ratio_is_the_recovery_first_step_over_the_median_step_before_the_kill():
    commits = _commits([0.0, 0.1, 0.2, 0.3, 0.5, 0.6])  # median gap before t=0.35: 0.1
    recovery = {
        "event": "recovery_done",
        "timeline": {"transfer_done": 10.0, "first_step": 10.15},
    }
    ratios = first_step_ratios([recovery], commits, [metrics.Kill(4, 0.35)])
    assert ratios == [pytest.approx(1.5)]


def test_refill_cpu_counts_spares_joined_after_the_first_failure_plus_the_template_share():
    events = [
        {"event": "process_join", "t": 1.0, "process": "spare0", "role": "spare", "pid": 10},
        {"event": "spare_ready", "t": 3.0, "process": "spare0", "cpu_seconds": 2.5},
        {"event": "failure", "t": 5.0},
        {"event": "process_join", "t": 5.1, "process": "spare1", "role": "spare", "pid": 11},
        {"event": "spare_ready", "t": 5.3, "process": "spare1", "cpu_seconds": 0.08, "forked": 1},
    ]
    log = "forked pid 10 in 4.0 ms (3.0 ms of CPU)\nforked pid 11 in 5.0 ms (20.0 ms of CPU)\n"
    assert metrics.refill_cpu(events, log) == [(pytest.approx(0.1), True)]
    assert metrics.refill_cpu(events[:2], log) == []  # no failure: no refill


def test_detect_is_each_kill_to_its_recovery_detected_and_start_is_launch_to_first_commit():
    events = [
        {"event": "job_start", "t": 1.0},
        {"event": "recovery_done", "timeline": {"detected": 5.012}},
        {"event": "recovery_done", "timeline": {"detected": 9.02}},
    ]
    kills = [metrics.Kill(40, 5.0), metrics.Kill(80, 9.0)]
    assert detect_ms(events, kills) == [pytest.approx(12.0), pytest.approx(20.0)]
    assert start_s(events, _commits([3.5, 3.6])) == pytest.approx(2.5)


def test_the_table_has_a_row_per_variant():
    found = VariantFigures(
        [1.2, 1.4], [20.0, 22.0], [0.1], [1.05], [1.02], [12.0], [2.5], [30.0], forked_refills=1
    )
    table = render({"template": found, "no template": VariantFigures()})
    assert "| template | 1.30 (1.20-1.40) | 21.0 (20.0-22.0) | 0.100 (0.100-0.100) | 12.0" in table
    assert "| 30.0 (30.0-30.0) | 1.050 (1.050-1.050) | 1.020 (1.020-1.020) | 1 (1) |" in table
    assert "| no template | - | - | - | - | - | - | - | - | 0 (0) |" in table
    assert span(_commits([2.0, 3.0, 4.5])) == 2.5
