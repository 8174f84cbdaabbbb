"""``python -m bench.control`` at its smallest scale: 4 node agents x 8 ranks, 2 failures.

A correctness test of the benchmark, not a speed target: the controller (a real child process)
publishes a plan after each reported failure, every recovery completes, and the figures are
sane. Paced by the benchmark's own events (each failure waits for the plan on every
survivor's stream and for ``recovery_done`` in the ledger); the timeouts are safety nets.
"""

from __future__ import annotations

import pytest

from bench.control import Options, measure
from bench.control_report import table


def _ordered(figures: dict[str, float] | None) -> bool:
    return figures is not None and 0 < figures["p50"] <= figures["p99"] <= figures["max"]


@pytest.mark.parametrize("unary", [(), ("heartbeats", "reports")], ids=["streams", "unary"])
def test_smallest_scale_publishes_a_plan_per_failure_with_sane_figures(unary):
    options = Options(spares=1, failures=2, steady=2.0, timeout=120.0, unary=unary)
    result = measure(4, options)

    assert result["status"] == "ok", result
    assert result["ranks"] == 32 and result["processes"] == 32 + 4  # a spare per node
    failures = result["failures"]
    assert failures["count"] == 2
    for key in (
        "report_to_abort_ms",
        "report_to_plan_ms",
        "controller_failure_to_planned_ms",
        "report_to_recovery_done_ms",
    ):
        assert _ordered(failures[key]), (key, failures[key])
    # A plan needs every survivor's halt, so it reaches the last survivor after every abort;
    # recovery_done needs every member's first step in the new generation, after the plan.
    assert failures["report_to_abort_ms"]["max"] < failures["report_to_plan_ms"]["max"]
    assert failures["report_to_plan_ms"]["max"] < failures["report_to_recovery_done_ms"]["max"]
    assert failures["controller_cpu_s_per_failure"] > 0

    beats = result["heartbeats"]
    assert beats["handled_per_s"] > 0 and beats["sent"] > beats["timed_out"]
    assert _ordered(beats["rank_latency_ms"]) and _ordered(beats["node_latency_ms"])
    controller = result["controller"]
    assert controller["rss_mib"] >= controller["idle_rss_mib"] > 0
    assert controller["steady_cores"] > 0
    assert len(result["loadavg_1min"]) == 2
    assert "| 32 (4) |" in table([result])
