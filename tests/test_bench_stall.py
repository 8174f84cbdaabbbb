"""``python -m bench.stall``'s table: each tree's phases, then the difference of the two trees'
medians with its 95 % interval, marked as noise when the interval spans 0."""

from __future__ import annotations

import argparse
import os

import pytest

from bench import procs, stall
from bench.metrics import FailureImpact, RecoveryPhases
from bench.runner import JobResult


def _job(total_ms: list[float]) -> JobResult:
    phases = [
        RecoveryPhases(0.012, 0.004, 0.006, 0.012, t / 1e3 - 0.034, t / 1e3, 15_000_000)
        for t in total_ms
    ]
    impacts = [FailureImpact(t / 1e3, t / 1e3, t / 1e3, 0, 1, 0, t / 1e3) for t in total_ms]
    refills = [t / 2e3 for t in total_ms]
    return JobResult(
        "torchrelay",
        "small",
        0,
        len(total_ms),
        impacts=impacts,
        phases=phases,
        refill_cpu_s=refills,
    )


def test_two_trees_get_a_row_of_differences_that_says_which_are_noise():
    shown = stall.table(
        {
            "this tree": [_job([60, 62, 58]), _job([61, 59, 63])],
            "baseline": [_job([80, 82, 78]), _job([81, 79, 83])],
        }
    )
    rows = shown.splitlines()
    assert len(rows) == 5 and rows[2].startswith("| this tree | 12.0 (12.0-12.0) |")
    difference = rows[4].split(" | ")
    assert difference[0] == "| difference (95 % interval)"
    assert difference[1] == "+0.0 [+0.0, +0.0] (noise)"  # detect: the same in both trees
    assert difference[6].startswith("-20.0 [") and "noise" not in difference[6]  # total
    assert difference[7].startswith("-20.0 [") and "noise" not in difference[7]  # stall
    assert difference[8].startswith("-20.0 [") and "noise" not in difference[8]  # time lost
    assert difference[9].startswith("-10.0 [") and "noise" not in difference[9]  # refill CPU


def test_one_tree_gets_no_row_of_differences():
    assert len(stall.table({"this tree": [_job([60, 61])]}).splitlines()) == 3


def test_a_baseline_setting_holds_only_while_its_jobs_run(monkeypatch):
    monkeypatch.setenv("TORCHRELAY_HUGEPAGES", "1")
    monkeypatch.delenv("BENCH_SRC", raising=False)
    settings = dict([stall._setting("TORCHRELAY_HUGEPAGES=0"), stall._setting("BENCH_SRC=/b")])
    with procs.environment(settings):
        assert os.environ["TORCHRELAY_HUGEPAGES"] == "0" and os.environ["BENCH_SRC"] == "/b"
    assert os.environ["TORCHRELAY_HUGEPAGES"] == "1" and "BENCH_SRC" not in os.environ
    with pytest.raises(argparse.ArgumentTypeError, match="not KEY=VALUE"):
        stall._setting("TORCHRELAY_HUGEPAGES")


def test_the_after_stall_table_takes_each_steps_median_over_every_kill_of_a_tree():
    def job(*series: list[float]) -> JobResult:
        return JobResult("torchrelay", "small", 0, len(series), after_stall=list(series))

    shown = stall.after_stall_table(
        {"this tree": [job([2.0, 1.5], [1.0, 1.5, 1.2]), job([3.0, 0.9])], "baseline": [job()]}
    )
    rows = shown.splitlines()
    assert rows[0].startswith("| tree | step 1 | step 2 | step 3 |") and rows[0].endswith("kills |")
    cells = rows[2].split(" | ")
    assert cells[1:4] == ["2.00", "1.50", "1.20"]  # step 3: the one kill that reached it
    assert cells[4] == "-" and cells[-1] == "3 |"
    assert rows[3] == "| baseline | " + " | ".join(["-"] * 10) + " | 0 |"
