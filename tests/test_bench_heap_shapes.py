"""``python -m bench.heap_shapes``: the shapes it draws, the row it makes of a run, and a real
run of each heap setting in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.heap_shapes import Shapes, summary

REPO = Path(__file__).resolve().parents[1]


def test_every_run_draws_the_same_shapes_within_the_bounds() -> None:
    shapes = Shapes(steps=50, max_batch=8, max_seq=300, width=32, seed=3)
    drawn = shapes.draw()
    assert drawn == shapes.draw() and len(drawn) == 50
    assert {b for b, _ in drawn} <= {1, 2, 4, 8} and len({b for b, _ in drawn}) > 1
    assert all(16 <= s <= 300 for _, s in drawn) and len({s for _, s in drawn}) > 10
    assert Shapes(50, 8, 300, 32, seed=4).draw() != drawn


def test_a_runs_row_leaves_out_the_first_two_steps() -> None:
    run = {
        "keeps_large_blocks": True,
        "step_s": [5.0, 4.0, 0.1, 0.3, 0.2],
        "faults": [900, 500, 0, 2, 4],
        "resident_mib": [100.0, 400.0, 300.0, 500.0, 200.0],
        "peak_mib": 512.0,
    }
    row = summary("kept", run)
    assert row["total_s"] == pytest.approx(9.6)
    assert row["step_ms"] == pytest.approx(200.0)
    assert row["faults"] == 2
    assert (row["peak_mib"], row["resident_mib"], row["end_mib"]) == (512.0, 300.0, 200.0)


def _bench(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.heap_shapes", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_each_setting_runs_in_a_process_whose_allocator_matches_it() -> None:
    out = _bench("--steps=4", "--max-seq=32", "--max-batch=2", "--width=32", "--repeats=1")
    assert out.returncode == 0, out.stderr
    rows = [line.split(" | ")[0] for line in out.stdout.splitlines()[2:]]
    assert rows == ["| kept", "| returned"]


def test_a_callers_own_tcache_setting_is_refused_in_one_line() -> None:
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}
    out = _bench("--steps=3", "--max-seq=16", "--max-batch=1", "--width=32", env=env)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("heap_shapes: the kept run's allocator")


def test_bad_bounds_are_refused() -> None:
    out = _bench("--steps=2")
    assert out.returncode == 2 and "--steps must be at least 3" in out.stderr
