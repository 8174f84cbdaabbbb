"""``python -m bench.state_sweep``: models named by their state's size, and the figures, fits
and table it makes of a job's kills."""

from __future__ import annotations

import argparse

import pytest

from bench import state_sweep
from bench.metrics import Commit, FailureImpact, RecoveryPhases
from bench.runner import JobResult
from bench.workload import MODELS, model_size, parse_model_name


@pytest.mark.parametrize("mb", [15, 100, 1000, 2000])
def test_aparse_model_named_by_its_state_holds_that_many_megabytes(mb):
    shape = model_size(f"state:{mb}")
    assert shape.state_bytes / 1e6 == pytest.approx(mb, rel=0.01)
    assert (shape.d_in, shape.d_out, shape.batch) == (128, 64, 32)  # the small model, wider


def test_named_models_keep_their_shapes_and_a_bad_name_is_refused():
    assert model_size("small") is MODELS["small"] and model_size("large") is MODELS["large"]
    for bad in ("medium", "state:", "state:0", "state:-5", "state:1.5"):
        with pytest.raises(ValueError, match="not one of"):
            model_size(bad)
        with pytest.raises(argparse.ArgumentTypeError):
            parse_model_name(bad)


def test_sizes_and_kills_must_be_positive_integers():
    assert state_sweep._counts("15,100") == [15, 100]
    for bad in ("", "15,x", "0", "15,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="not positive integers"):
            state_sweep._counts(bad)


def _job(mb: int, stall_s: float, step_s: float) -> JobResult:
    """Two kills of a job whose steps take ``step_s``: each recovery moved ``mb`` MB."""
    commits = [Commit(i, i * step_s, 2) for i in range(100)]
    phases = [RecoveryPhases(0.01, 0.0, 0.0, mb / 2000, 0.0, stall_s, mb * 10**6)] * 2
    impact = FailureImpact(stall_s, stall_s, stall_s, 0, 1, 0, stall_s)
    job = JobResult("torchrelay", f"state:{mb}", 0, 2, impacts=[impact] * 2, phases=phases)
    job.commits, job.kill_times = commits, [40.5 * step_s, 80.5 * step_s]
    return job


def test_a_size_row_holds_each_kill_figure_and_the_floor_for_the_bytes_moved():
    row = state_sweep.figures(100, _job(100, 0.2, 0.05), floor_bytes_per_s=4e9)
    assert row["bytes"] == 100 * 10**6
    assert row["stall_s"] == [0.2, 0.2] and row["transfer_s"] == [0.05, 0.05]
    assert row["step_s"] == [pytest.approx(0.05)] * 2
    assert row["floor_s"] == [pytest.approx(0.025)]


def test_fits_recover_a_linear_stall_and_the_table_shows_every_size():
    # stall = 40 ms + MB / 500 MB/s; transfer = MB / 2000 MB/s
    rows = [
        state_sweep.figures(mb, _job(mb, 0.04 + mb / 500, 0.01 + mb / 1000), 4e9)
        for mb in (15, 100, 500)
    ]
    found = state_sweep.fits(rows)
    assert found["stall_s"] == (pytest.approx(0.04), pytest.approx(500))
    assert found["transfer_s"] == (pytest.approx(0.0, abs=1e-9), pytest.approx(2000))
    shown = state_sweep.table(rows).splitlines()
    assert shown[2].startswith("| 15 | 70 (70-70) |") and shown[4].startswith("| 500 |")
    assert shown[-1].startswith("fits: stall +40 ms + MB / 500 MB/s")
