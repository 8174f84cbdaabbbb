"""Invariants 1-3 with real processes: a SIGKILLed worker (any rank, any phase, several times)
is rebuilt on a hot spare from live replicas; nothing committed is lost, at most the step in
flight is recomputed, and the final weights equal the failure-free run bit for bit."""

from __future__ import annotations

import pytest

from tests.jobs import assert_bitwise_equal, injected_failures, run_job
from torchrelay.report.summary import PHASES

pytestmark = pytest.mark.slow
STEPS = 10


@pytest.mark.parametrize(
    "chaos",
    [
        ("kill:rank=0:step=3",),
        ("kill:rank=0:step=9:phase=backward",),
        ("kill:rank=1:step=6:phase=backward",),
        ("kill:rank=2:step=0:phase=backward",),
        ("kill:rank=1:step=1", "kill:rank=2:step=4", "kill:rank=0:step=7:phase=backward"),
    ],
    ids=[
        "rank0-forward",
        "rank0-backward-last-step",
        "rank1-backward",
        "rank2-first-step",
        "three-kills-one-run",
    ],
)
def test_killed_worker_is_rebuilt_and_weights_stay_bitwise_equal(
    tmp_path, reference_weights, chaos
):
    job = run_job(tmp_path, chaos=chaos, steps=STEPS)
    assert job.returncode == 0, job.output
    assert_bitwise_equal(job.weights(), reference_weights(STEPS), job)

    summary = job.summary()
    assert summary["steps_committed"] == STEPS
    assert summary["chaos_fired"] == len(chaos)
    failures = injected_failures(summary)
    assert len(failures) == len(chaos)
    assert summary["zero_loss_recoveries"] == len(summary["failures"])
    # A rank killed after its last contribution left may let the survivors commit the step:
    # then the job resumes one step later and nothing at all is recomputed.
    killed_in = sorted(int(spec.split("step=")[1].split(":")[0]) for spec in chaos)
    resumed = sorted(f["resumed_at_step"] for f in failures)
    assert all(s in (k, k + 1) for s, k in zip(resumed, killed_in, strict=True)), resumed
    for failure in failures:
        assert failure["cause"] == "SIGKILL" and failure["recovered"]
        assert failure["lost_steps"] == 0
        assert failure["recomputed_steps"] <= 1
        assert failure["bytes_transferred"] > 0

    for recovery in (e for e in job.ledger() if e["event"] == "recovery_done"):
        times = [recovery["timeline"][p] for p in PHASES]
        assert times == sorted(times), f"phases out of order: {recovery['timeline']}"
        assert recovery["recovery_seconds"] == pytest.approx(times[-1] - times[0])


def test_user_bug_on_every_replacement_stops_after_max_restarts(tmp_path):
    job = run_job(
        tmp_path,
        spares=2,
        launcher_args=("--max-restarts", "1"),
        script_args=("--bug-rank", "1", "--bug-step", "4"),
    )
    assert job.returncode == 1
    assert "deliberate bug at step 4" in job.output  # the original traceback is shown
    end = [e for e in job.ledger() if e["event"] == "job_end"][-1]
    assert end["status"] == "failed"
    assert "bug in the script" in end["reason"] and "max restarts 1" in end["reason"]
    assert "ValueError: deliberate bug at step 4" in end["traceback"]
    failures = [e for e in job.ledger() if e["event"] == "failure"]
    assert len(failures) == 2 and all(f["kind"] == "exception" for f in failures)
    assert not (tmp_path / "final.pt").exists()
