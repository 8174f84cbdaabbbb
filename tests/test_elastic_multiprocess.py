"""An ``--elastic --spares 0`` job on real processes: a killed worker's rank is hosted by a
survivor (the job carries on with 2 processes, the global batch unchanged), a spare started by
``torchrelay grow`` takes it back at a step boundary, and ``torchrelay shrink`` releases rank 0
(its host saves the final weights as rank 0); no committed step is lost, and the final weights
equal the failure-free run's within the stated tolerance (float summation order, see
docs/elastic.md).

Paced by events: the job waits on a leash while the test asks for each change, and goes on once
the ledger shows it started.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.jobs import (
    JobResult,
    await_event,
    await_events,
    await_status,
    cli,
    ledger_events,
    move_leash,
    start_job,
)

pytestmark = pytest.mark.slow
STEPS = 100  # the failure-free reference of this many steps is shared with other tests
GROW_AT, SHRINK_AT = 20, 50
# Steps of 50 ms: a handover's boundary (0.75 s of steps past the last report) lies well
# before the next hold and the end.
PACE = ("--compute-seconds", "0.05")
# Measured: about 1e-7 apart at most after 60-100 steps (AdamW, float32); the order of the
# additions in an all-reduce is all that differs.
RTOL, ATOL = 1e-5, 1e-6


def _events(run_dir, name: str) -> list[dict]:
    return [e for e in ledger_events(run_dir) if e["event"] == name]


def test_a_killed_rank_is_hosted_then_regrows_and_an_operator_shrinks_it_again(
    tmp_path, reference_weights
):
    run_dir, leash = tmp_path / "run", tmp_path / "leash"
    move_leash(leash, GROW_AT)
    proc = start_job(
        run_dir,
        nproc=3,
        spares=0,
        steps=STEPS,
        chaos=("kill:rank=1:step=5",),
        launcher_args=("--elastic",),
        script_args=("--leash", str(leash), *PACE),
    )
    try:
        shrunk = await_event(run_dir, "job_shrunk")
        assert shrunk["slots"] == [1] and shrunk["processes"] == 2
        status = await_status(run_dir, lambda s: s["steps_committed"] >= GROW_AT - 1)
        assert status["hosted"] == {"1": shrunk["hosts"]["1"]} and len(status["slots"]) == 2

        grow = cli("grow", "--run-dir", str(run_dir))
        assert grow.returncode == 0 and "hosted rank(s) [1]" in grow.stdout, grow.stderr
        await_event(run_dir, "handover_start")
        move_leash(leash, SHRINK_AT)
        await_event(run_dir, "job_grown")
        await_events(run_dir, "handover_done", 1)
        await_status(run_dir, lambda s: s["steps_committed"] >= SHRINK_AT - 1)

        # Rank 0 released: its host saves the final weights as rank 0 after the loop.
        shrink = cli("shrink", "--run-dir", str(run_dir), "--rank", "0")
        assert shrink.returncode == 0 and "releasing rank 0" in shrink.stdout, shrink.stderr
        await_events(run_dir, "handover_start", 2)  # the release's boundary is set
        move_leash(leash, STEPS)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    job = JobResult(proc.returncode, output, run_dir)
    assert job.returncode == 0, output

    ours, ref = job.weights(), reference_weights(STEPS)
    assert ours.keys() == ref.keys()
    for name in ref:
        assert torch.allclose(ours[name], ref[name], rtol=RTOL, atol=ATOL), name

    shrinks = _events(run_dir, "job_shrunk")
    assert [s["slots"] for s in shrinks] == [[1], [0]]
    assert "released" in shrinks[1]["reason"] and shrinks[1]["processes"] == 2
    assert shrinks[1]["hosts"] == {"0": 1}  # the least loaded survivor, the lowest slot
    (grown,) = _events(run_dir, "job_grown")
    assert grown["slots"] == [1] and grown["hosts"] == {}
    (recovered,) = _events(run_dir, "recovery_done")
    # At most the step the kill interrupted is redone, as in any crash recovery.
    assert recovered["lost_steps"] == 0 and recovered["recomputed_steps"] <= 1
    moves = _events(run_dir, "handover_done")
    assert len(moves) == 2 and all(m["lost_steps"] == m["recomputed_steps"] == 0 for m in moves)
    summary = job.summary()
    assert summary["steps_committed"] == STEPS and len(summary["failures"]) == 1
    assert [r["change"] for r in summary["resizes"]] == ["shrunk", "grown", "shrunk"]
