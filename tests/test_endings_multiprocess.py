"""How jobs end, with real processes: a script that can never run stops at once with its
traceback (before init, before its first commit, an unmodified torchrun script), a failure
after the training loop fails the job, a kill with no spare stops at once naming the step in
flight, tracking the inner module of a DDP recovers bit for bit, and a refill spare still starting
when the job succeeds is stopped, not awaited."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import assert_bitwise_equal, cli, run_job

pytestmark = pytest.mark.slow
STEPS = 10
# Each job below stops within seconds; on the old code they hung (hence the timeout) or
# waited out the 300 s spare timeout.
TIMEOUT = 180
EXAMPLE = Path(__file__).parents[1] / "src" / "torchrelay" / "examples" / "train_gpt.py"


def _end(job) -> dict:
    return [e for e in job.ledger() if e["event"] == "job_end"][-1]


def _seconds(job) -> float:
    """From the first process exit to the end of the job."""
    events = job.ledger()
    first_exit = next(e["t"] for e in events if e["event"] == "process_exit")
    return _end(job)["t"] - first_exit


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("raise", "failed (exit code 1) before calling torchrelay.init()"),
        ("exit", "exited with status 0 without ever calling torchrelay.init()"),
    ],
)
def test_a_script_that_never_calls_init_stops_at_once(tmp_path, mode, says):
    job = run_job(tmp_path, timeout=TIMEOUT, script_args=("--before-init", mode))
    assert job.returncode == 1, job.output
    end = _end(job)
    assert end["status"] == "failed" and says in end["reason"], end
    assert "\n" not in end["reason"] and "times" not in end["reason"]
    if mode == "raise":
        assert "RuntimeError: deliberate bug before torchrelay.init()" in end["traceback"]
        assert "RuntimeError: deliberate bug before torchrelay.init()" in job.output
    assert f"torchrelay: job failed: {end['reason']}" in job.output
    assert _seconds(job) < 30


def test_a_bug_before_the_first_commit_is_not_retried(tmp_path):
    job = run_job(
        tmp_path, timeout=TIMEOUT, spares=2, script_args=("--bug-rank", "1", "--bug-step", "0")
    )
    assert job.returncode == 1, job.output
    end = _end(job)
    assert end["reason"].startswith("rank 1 (worker1) failed in step 0 (exit code 1)")
    assert "failed 4 times" not in end["reason"]
    assert "ValueError: deliberate bug at step 0" in end["traceback"]
    events = [e["event"] for e in job.ledger()]
    assert events.count("failure") == 1 and "recovery_start" not in events


def test_an_unmodified_torchrun_script_is_stopped_with_what_to_change(tmp_path):
    job = run_job(tmp_path, timeout=TIMEOUT, script="torchrun_ddp.py", nproc=2)
    assert job.returncode == 1, job.output
    reason = _end(job)["reason"]
    assert "unmodified torchrun script" in reason and "needs torchrelay.init()" in reason
    assert "torchrelay run --transparent" in reason and "\n" not in reason
    # Whichever dies first ends the job: rank 0 (the store's port is taken), a rank waiting in
    # its own rendezvous, or the spare (no RANK): each exited without joining.
    ledger = job.ledger()
    first_exit = next(e for e in ledger if e["event"] == "process_exit")
    assert first_exit["note"] == "exited before joining"
    assert first_exit["process"] in reason.split(" exited")[0]  # "rank 0 (worker0)" / "spare0"
    failures = [e for e in ledger if e["event"] == "failure"]
    assert all(f["detected_by"] == "process exit before joining the job" for f in failures)
    assert _seconds(job) < 60  # a hang would run into TIMEOUT


def test_a_failure_after_the_training_loop_fails_the_job(tmp_path):
    job = run_job(tmp_path, timeout=TIMEOUT, script_args=("--fail-saving",))
    assert job.returncode == 1, job.output
    end = _end(job)
    assert end["status"] == "failed" and end["steps_committed"] == STEPS
    assert "rank 0 (worker0) failed after its last step (exit code 1)" in end["reason"]
    assert "OSError: deliberate failure while saving the final model" in end["traceback"]
    assert "OSError: deliberate failure while saving" in job.output


def test_a_kill_without_spares_stops_at_once_naming_the_step_in_flight(tmp_path):
    job = run_job(tmp_path, timeout=TIMEOUT, spares=0, chaos=("kill:rank=1:step=3",))
    assert job.returncode == 1, job.output
    events = job.ledger()
    end = _end(job)
    assert end["reason"].startswith("rank(s) [1] lost in step 3 (rank 1: SIGKILL)"), end
    assert "none will come" in end["reason"]
    failure = next(e for e in events if e["event"] == "failure")
    assert end["t"] - failure["t"] < 30.0  # not the 300 s spare timeout
    (abandoned,) = (e for e in events if e["event"] == "recovery_abandoned")
    assert abandoned["step"] == 3
    assert [f["step"] for f in job.summary()["failures"]] == [3]


def test_tracking_the_inner_module_of_a_ddp_recovers_bitwise(tmp_path, reference_weights):
    job = run_job(
        tmp_path, chaos=("kill:rank=1:step=4",), steps=STEPS, script_args=("--track-inner",)
    )
    assert job.returncode == 0, job.output
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
    (failure,) = job.summary()["failures"]
    assert failure["recovered"] and failure["lost_steps"] == 0
    # The survivors' own stall, detection included: from their last commit before the kill
    # (before every member halted) to their first after it (after every transfer finished).
    (done,) = (e for e in job.ledger() if e["event"] == "recovery_done")
    gaps = done["survivor_gap_seconds"]
    assert sorted(gaps) == ["0", "2"]
    timeline = done["timeline"]
    assert all(gap >= timeline["transfer_done"] - timeline["halted"] for gap in gaps.values())
    report = cli("report", str(tmp_path)).stdout
    assert "survivors stalled (last commit -> next commit): rank 0" in report


def test_a_refill_spare_still_starting_when_the_job_ends_is_stopped_not_awaited(tmp_path):
    """The job succeeds while a fresh refill spare (``--no-template``) is still starting. Its
    agent stops it at once: the launcher used to wait for it to come up only to dismiss it,
    and the spare then died of SIGABRT in the interpreter's teardown ("terminate called
    without an active exception", its thread still filling receive buffers)."""
    steps = 40
    job = run_job(
        tmp_path,
        timeout=TIMEOUT,
        script=str(EXAMPLE),
        nproc=2,
        chaos=(f"kill:rank=1:step={steps - 4}",),
        launcher_args=("--no-template",),
        steps=steps,
    )
    assert job.returncode == 0, job.output
    events = job.ledger()
    ended = _end(job)["t"]
    assert not [e for e in events if e["event"] == "process_join" and e["t"] > ended]
    exits = {e["process"]: e for e in events if e["event"] == "process_exit"}
    assert exits.pop("worker1")["returncode"] == -9
    refill = exits.pop("spare1")
    assert refill.get("note") == "exited before joining" or refill["returncode"] == 0, refill
    assert all(e["returncode"] == 0 for e in exits.values()), exits
    assert "terminate called" not in job.output
