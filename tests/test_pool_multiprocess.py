"""Borrowing on real processes: a ``torchrelay pool`` of 4 slots, job L (priority 0,
``--elastic``, 2 workers) and job H (priority 10, no spare, 2 workers). A worker of H is
killed: the pool asks L to release a process at its next step boundary, H recovers on the freed
slot; when H finishes, the loan comes back and L grows onto it. H loses no committed step and
ends bitwise equal to its failure-free run; L loses none and ends equal to it within the
elastic tolerance (float summation order while shrunk, docs/elastic.md).

Paced by events: L waits on a leash at each stage and goes on once its ledger shows the next
change asked for (the release's boundary, the regrow's boundary).
"""

from __future__ import annotations

import pytest
import torch

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_event,
    await_events,
    move_leash,
    run_job,
)
from tests.pool_jobs import lender_and_borrower

pytestmark = pytest.mark.slow
STEPS, LEND_AT, HOLD = 60, 8, 10
# Steps of 50 ms: a boundary lies about 15 steps past the held step; L is held again HOLD
# steps past the release's boundary, and the regrow's boundary lies well before STEPS.
PACE = ("--compute-seconds", "0.05")
RTOL, ATOL = 1e-5, 1e-6  # docs/elastic.md


def test_a_high_priority_job_borrows_a_slot_and_the_lender_grows_back(tmp_path):
    reference = run_job(tmp_path / "reference", nproc=2, spares=0, steps=STEPS, script_args=PACE)
    assert reference.returncode == 0, reference.output
    with lender_and_borrower(tmp_path, STEPS, LEND_AT, PACE, elastic=True) as jobs:
        lend = await_event(jobs.low_dir, "pool_lend")
        assert lend["borrower"] == "H" and lend["slot"] == 1 and "refused" not in lend
        boundary = await_event(jobs.low_dir, "handover_start")["boundary"]  # the release's
        move_leash(jobs.leash, boundary + HOLD)
        high_output, _ = jobs.high.communicate(timeout=300)
        assert jobs.high.returncode == 0, high_output

        await_event(jobs.low_dir, "pool_returned")
        # the regrow's boundary is set
        regrow = await_events(jobs.low_dir, "handover_start", 2, timeout=180)[1]
        assert regrow["boundary"] < STEPS
        (loan,) = jobs.pool.loans()
        assert (loan["lender"], loan["borrower"], loan["state"]) == ("L", "H", "returned")
        move_leash(jobs.leash, STEPS)
        low_output, _ = jobs.low.communicate(timeout=300)
        assert jobs.low.returncode == 0, low_output

    h = JobResult(jobs.high.returncode, high_output, jobs.high_dir)
    assert_bitwise_equal(h.weights(), reference.weights(), h)
    (granted,) = [e for e in h.ledger() if e["event"] == "pool_granted"]
    assert granted["lender"] == "L" and granted["slot"] == 1
    (recovered,) = [e for e in h.ledger() if e["event"] == "recovery_done"]
    assert recovered["lost_steps"] == 0 and h.summary()["steps_committed"] == STEPS

    low_job = JobResult(jobs.low.returncode, low_output, jobs.low_dir)
    ours, ref = low_job.weights(), reference.weights()
    for name in ref:
        assert torch.allclose(ours[name], ref[name], rtol=RTOL, atol=ATOL), name
    ledger = low_job.ledger()
    (shrunk,) = [e for e in ledger if e["event"] == "job_shrunk"]
    assert shrunk["slots"] == [1] and "released" in shrunk["reason"] and shrunk["processes"] == 1
    (grown,) = [e for e in ledger if e["event"] == "job_grown"]
    assert grown["slots"] == [1] and grown["hosts"] == {}
    moves = [e for e in ledger if e["event"] == "handover_done"]
    assert len(moves) == 2 and all(m["lost_steps"] == 0 for m in moves)
    assert low_job.summary()["steps_committed"] == STEPS
