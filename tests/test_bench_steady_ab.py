"""``python -m bench.steady_ab``'s summary: each variant's ratio to plain DDP per round, pooled
over the runs, and B - C (the per-step work) both over the pooled rounds and per run, since B
and C take turns in the same processes and a run is therefore a pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import steady_ab

REPO = Path(__file__).resolve().parents[1]


def _run(b_over_a: float, c_over_a: float, rounds: int = 8) -> dict[str, Any]:
    """A run's raw figures as a worker writes them: blocks of (wall, cpu, faults) per step;
    A runs every round, B in the even rounds and C in the odd ones."""
    plain = [[0.02, 0.015, 0.0] for _ in range(rounds)]
    relay = [[0.02 * b_over_a, 0.015 * b_over_a, 0.0] for _ in range(rounds // 2)]
    group = [[0.02 * c_over_a, 0.015 * c_over_a, 0.0] for _ in range(rounds // 2)]
    return {
        "plain": plain,
        "relay": relay,
        "group": group,
        "weights_equal": True,
        "native": True,
        "fast_lane": 10,
        "per_step_work_s": 95e-6,
    }


def test_the_per_step_work_is_taken_per_run_as_well_as_over_the_pooled_rounds():
    summary = steady_ab.summarize([_run(1.02, 1.00), _run(1.03, 1.02), _run(1.01, 1.00)])
    wall = summary["wall"]
    assert wall["relay"]["run_medians"] == pytest.approx([1.02, 1.03, 1.01])
    assert wall["group"]["run_medians"] == pytest.approx([1.00, 1.02, 1.00])
    # Per run, B - C pairs each run's own B with its own C.
    assert wall["per_step_work_runs"] == pytest.approx([0.02, 0.01, 0.01])
    assert wall["per_step_work_over_runs"]["median"] == pytest.approx(0.01)
    lo, hi = wall["relay"]["runs_interval"]
    assert 1.01 - 1e-9 <= lo <= 1.02 <= hi <= 1.03 + 1e-9
    # Pooled, the medians of all rounds: B's 1.02, C's 1.00.
    assert wall["per_step_work"]["median"] == pytest.approx(0.02)
    assert summary["weights_equal"] and summary["guard"] == "compiled"
    assert summary["per_step_work_us"] == pytest.approx([95.0] * 3)


def test_a_run_whose_weights_differ_makes_the_summary_say_so():
    unequal = {**_run(1.0, 1.0), "weights_equal": False}
    assert steady_ab.summarize([_run(1.0, 1.0), unequal])["weights_equal"] is False


def _pool(tmp_path: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    command = [sys.executable, "-m", "bench.steady_ab", "--pool", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)


def test_saved_series_are_summarized_together(tmp_path: Path):
    first, second = tmp_path / "tree.json", tmp_path / "more.json"
    first.write_text(json.dumps({"raw": [_run(1.02, 1.00)]}))
    second.write_text(json.dumps({"raw": [_run(1.03, 1.02), _run(1.01, 1.00)]}))
    shown = _pool(tmp_path, first, second)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("3 saved run(s) from 2 file(s)")
    assert "per run +0.020, +0.010, +0.010, their median +0.010" in shown.stdout


def test_a_file_that_is_not_a_saved_series_gets_a_one_line_error(tmp_path: Path):
    (tmp_path / "other.json").write_text(json.dumps({"plain": []}))
    for name in ("missing.json", "other.json"):
        shown = _pool(tmp_path, tmp_path / name)
        assert shown.returncode == 2 and "Traceback" not in shown.stderr
        assert shown.stderr.splitlines()[-1].startswith("steady_ab.py: error: --pool: ")
