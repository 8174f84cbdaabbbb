"""Parking on real processes: a ``torchrelay pool`` of 4 slots, job L (priority 0, 2 workers,
not --elastic: it cannot shrink) and job H (priority 10, no spare, 2 workers). A worker of H is
killed: L parks whole at its next step boundary (both processes halt and wait in place), H
recovers on L's slot with 0 steps lost; when H finishes, L's slots come back, the same L
processes resume from the boundary and L ends with 0 steps lost. Both end bitwise equal to
their failure-free run. Paced by ledger events (L waits on a leash until its park boundary is
set)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_event,
    await_status,
    cli,
    move_leash,
    run_job,
    start_job,
)
from tests.test_pool_multiprocess import PACE, _start_pool

pytestmark = pytest.mark.slow
STEPS, LEND_AT = 60, 8


def test_a_lender_at_its_minimum_parks_whole_and_resumes_exactly(tmp_path):
    reference = run_job(tmp_path / "reference", nproc=2, spares=0, steps=STEPS, script_args=PACE)
    assert reference.returncode == 0, reference.output
    pool, address, token = _start_pool(tmp_path)
    attach = ("--pool", address, "--pool-token", token)
    low_dir, high_dir, leash = tmp_path / "L", tmp_path / "H", tmp_path / "leash"
    move_leash(leash, LEND_AT)
    low = start_job(
        low_dir,
        nproc=2,
        spares=0,
        steps=STEPS,
        launcher_args=(*attach, "--priority", "0", "--job-name", "L"),
        script_args=("--leash", str(leash), *PACE),
    )
    high = None
    try:
        await_status(low_dir, lambda s: s["steps_committed"] >= LEND_AT - 1)
        high = start_job(
            high_dir,
            nproc=2,
            spares=0,
            steps=STEPS,
            chaos=("kill:rank=1:step=5",),
            launcher_args=(*attach, "--priority", "10", "--job-name", "H"),
            script_args=PACE,
        )
        lend = await_event(low_dir, "pool_lend")
        assert (lend["borrower"], lend["kind"]) == ("H", "park") and "refused" not in lend
        boundary = await_event(low_dir, "handover_start")["boundary"]
        move_leash(leash, STEPS)  # L runs to its boundary and parks there
        parked = await_event(low_dir, "job_parked")
        assert parked["step"] == boundary and parked["borrower"] == "H"
        await_status(low_dir, lambda s: s["parked"])
        high_output, _ = high.communicate(timeout=300)
        assert high.returncode == 0, high_output
        unparked = await_event(low_dir, "job_unparked")
        assert unparked["step"] == boundary and len(unparked["slots"]) == 2
        low_output, _ = low.communicate(timeout=300)
        assert low.returncode == 0, low_output
        status = cli("status", "--pool", address, "--pool-token", token, "--json")
        assert status.returncode == 0, status.stderr
        (loan,) = json.loads(status.stdout)["loans"]
        assert (loan["lender"], loan["kind"], loan["state"]) == ("L", "park", "returned")
    finally:
        for proc in (low, high, pool):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL if proc is not pool else signal.SIGTERM)
        pool.communicate(timeout=30)

    h = JobResult(high.returncode, high_output, high_dir)
    assert_bitwise_equal(h.weights(), reference.weights(), h)
    (granted,) = [e for e in h.ledger() if e["event"] == "pool_granted"]
    assert (granted["lender"], granted["kind"]) == ("L", "park")
    (recovered,) = [e for e in h.ledger() if e["event"] == "recovery_done"]
    assert recovered["lost_steps"] == 0 and h.summary()["steps_committed"] == STEPS

    low_job = JobResult(low.returncode, low_output, low_dir)
    assert_bitwise_equal(low_job.weights(), reference.weights(), low_job)
    ledger = low_job.ledger()
    (done,) = [e for e in ledger if e["event"] == "handover_done"]
    assert done["lost_steps"] == 0 and done["recomputed_steps"] == 0 and done["retired"] == []
    assert low_job.summary()["steps_committed"] == STEPS
    assert not [e for e in ledger if e["event"] in ("failure", "hang_detected")]
