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

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_event,
    await_events,
    await_status,
    cli,
    move_leash,
    run_job,
    start_job,
)

pytestmark = pytest.mark.slow
STEPS, LEND_AT, HOLD = 60, 8, 10
# Steps of 50 ms: a boundary lies about 15 steps past the held step; L is held again HOLD
# steps past the release's boundary, and the regrow's boundary lies well before STEPS.
PACE = ("--compute-seconds", "0.05")
RTOL, ATOL = 1e-5, 1e-6  # docs/elastic.md


def _start_pool(tmp_path) -> tuple[subprocess.Popen, str, str]:
    token, address = tmp_path / "pool.token", tmp_path / "pool.address"
    pool = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchrelay.cli.main",
            "pool",
            "--slots",
            "4",
            "--token-file",
            str(token),
            "--address-file",
            str(address),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not address.exists() or not address.read_text().endswith("\n"):
        assert pool.poll() is None and time.monotonic() < deadline, pool.communicate()[0]
        time.sleep(0.05)
    return pool, address.read_text().strip(), str(token)


def test_a_high_priority_job_borrows_a_slot_and_the_lender_grows_back(tmp_path):
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
        launcher_args=(*attach, "--priority", "0", "--job-name", "L", "--elastic"),
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
        assert lend["borrower"] == "H" and lend["slot"] == 1 and "refused" not in lend
        boundary = await_event(low_dir, "handover_start")["boundary"]  # the release's
        move_leash(leash, boundary + HOLD)
        high_output, _ = high.communicate(timeout=300)
        assert high.returncode == 0, high_output

        await_event(low_dir, "pool_returned")
        # the regrow's boundary is set
        regrow = await_events(low_dir, "handover_start", 2, timeout=180)[1]
        assert regrow["boundary"] < STEPS
        status = cli("status", "--pool", address, "--pool-token", token, "--json")
        assert status.returncode == 0, status.stderr
        (loan,) = json.loads(status.stdout)["loans"]
        assert (loan["lender"], loan["borrower"], loan["state"]) == ("L", "H", "returned")
        move_leash(leash, STEPS)
        low_output, _ = low.communicate(timeout=300)
        assert low.returncode == 0, low_output
    finally:
        for proc in (low, high, pool):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL if proc is not pool else signal.SIGTERM)
        pool.communicate(timeout=30)

    h = JobResult(high.returncode, high_output, high_dir)
    assert_bitwise_equal(h.weights(), reference.weights(), h)
    (granted,) = [e for e in h.ledger() if e["event"] == "pool_granted"]
    assert granted["lender"] == "L" and granted["slot"] == 1
    (recovered,) = [e for e in h.ledger() if e["event"] == "recovery_done"]
    assert recovered["lost_steps"] == 0 and h.summary()["steps_committed"] == STEPS

    low_job = JobResult(low.returncode, low_output, low_dir)
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
