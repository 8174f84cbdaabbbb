"""A forged control value in the store is a failed transfer, re-planned -- never an exception
in the user's script counted against --max-restarts (real processes)."""

from __future__ import annotations

import pytest

from tests.jobs import assert_bitwise_equal, run_job

pytestmark = pytest.mark.slow


def test_garbage_schema_is_a_failed_transfer_and_is_replanned(tmp_path, reference_weights):
    job = run_job(
        tmp_path,
        script="forged_schema_train.py",
        chaos=("kill:rank=1:step=3",),
        # One re-plan is granted; an exception in a script would be a failure of its own.
        launcher_args=("--max-restarts", "1"),
        steps=10,
    )
    assert job.returncode == 0, job.output
    assert (tmp_path / "forged").exists()  # the receiver did read the garbage
    events = job.ledger()
    failed = [e for e in events if e["event"] == "recovery_failed"]
    assert failed and "schema of generation 1 was rejected" in failed[0]["reason"]
    assert [e["kind"] for e in events if e["event"] == "failure"] == ["signal"]
    assert_bitwise_equal(job.weights(), reference_weights(10))
    summary = job.summary()
    assert summary["steps_committed"] == 10 and summary["zero_loss_recoveries"] == 1
