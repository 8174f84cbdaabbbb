"""Parking on real processes: a ``torchrelay pool`` of 4 slots, job L (priority 0, 2 workers,
not --elastic: it cannot shrink) and job H (priority 10, no spare, 2 workers). A worker of H is
killed: L parks whole at its next step boundary (both processes halt and wait in place), H
recovers on L's slot with 0 steps lost; when H finishes, L's slots come back, the same L
processes resume from the boundary and L ends with 0 steps lost. Both end bitwise equal to
their failure-free run. Paced by ledger events (L waits on a leash until its park boundary is
set)."""

from __future__ import annotations

import pytest

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_event,
    await_status,
    move_leash,
    run_job,
)
from tests.pool_jobs import lender_and_borrower
from tests.test_pool_multiprocess import PACE

pytestmark = pytest.mark.slow
STEPS, LEND_AT = 60, 8


def test_a_lender_at_its_minimum_parks_whole_and_resumes_exactly(tmp_path):
    reference = run_job(tmp_path / "reference", nproc=2, spares=0, steps=STEPS, script_args=PACE)
    assert reference.returncode == 0, reference.output
    with lender_and_borrower(tmp_path, STEPS, LEND_AT, PACE, elastic=False) as jobs:
        lend = await_event(jobs.low_dir, "pool_lend")
        assert (lend["borrower"], lend["kind"]) == ("H", "park") and "refused" not in lend
        boundary = await_event(jobs.low_dir, "handover_start")["boundary"]
        move_leash(jobs.leash, STEPS)  # L runs to its boundary and parks there
        parked = await_event(jobs.low_dir, "job_parked")
        assert parked["step"] == boundary and parked["borrower"] == "H"
        await_status(jobs.low_dir, lambda s: s["parked"])
        high_output, _ = jobs.high.communicate(timeout=300)
        assert jobs.high.returncode == 0, high_output
        unparked = await_event(jobs.low_dir, "job_unparked")
        assert unparked["step"] == boundary and len(unparked["slots"]) == 2
        low_output, _ = jobs.low.communicate(timeout=300)
        assert jobs.low.returncode == 0, low_output
        (loan,) = jobs.pool.loans()
        assert (loan["lender"], loan["kind"], loan["state"]) == ("L", "park", "returned")

    h = JobResult(jobs.high.returncode, high_output, jobs.high_dir)
    assert_bitwise_equal(h.weights(), reference.weights(), h)
    (granted,) = [e for e in h.ledger() if e["event"] == "pool_granted"]
    assert (granted["lender"], granted["kind"]) == ("L", "park")
    (recovered,) = [e for e in h.ledger() if e["event"] == "recovery_done"]
    assert recovered["lost_steps"] == 0 and h.summary()["steps_committed"] == STEPS

    low_job = JobResult(jobs.low.returncode, low_output, jobs.low_dir)
    assert_bitwise_equal(low_job.weights(), reference.weights(), low_job)
    ledger = low_job.ledger()
    (done,) = [e for e in ledger if e["event"] == "handover_done"]
    assert done["lost_steps"] == 0 and done["recomputed_steps"] == 0 and done["retired"] == []
    assert low_job.summary()["steps_committed"] == STEPS
    assert not [e for e in ledger if e["event"] in ("failure", "hang_detected")]
