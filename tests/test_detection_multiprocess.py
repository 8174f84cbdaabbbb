"""Failures nastier than a clean SIGKILL, with real processes: a stopped (hung) worker, deaths
during a recovery, the last replica lost, a straggler, and a soak of 30 mixed failures."""

from __future__ import annotations

import pytest

from tests.conftest import require_built
from tests.jobs import assert_bitwise_equal, injected_failures, run_job
from torchrelay.chaos import random_schedule
from torchrelay.stack_dump import END

pytestmark = pytest.mark.slow
STEPS = 10
FAST_HANG = ("--hang-floor", "2")


def _assert_clean_recoveries(job, failures: int) -> dict:
    assert job.returncode == 0, job.output
    summary = job.summary()
    assert summary["status"] == "succeeded"
    assert len(injected_failures(summary)) == failures
    assert all(f["recovered"] and f["lost_steps"] == 0 for f in summary["failures"])
    assert all(f["recomputed_steps"] <= 1 for f in summary["failures"])
    return summary


def test_stopped_worker_is_detected_by_silence_fenced_and_replaced(tmp_path, reference_weights):
    job = run_job(
        tmp_path, chaos=("hang:rank=1:step=4:phase=backward",), steps=STEPS, launcher_args=FAST_HANG
    )
    summary = _assert_clean_recoveries(job, failures=1)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
    (failure,) = injected_failures(summary)
    assert "heartbeat silent" in failure["detected_by"] and failure["cause"] == "SIGKILL"
    assert summary["hangs_detected"] == 1
    # The stall includes the silence before detection (at least the 2 s hang timeout); the
    # recovery, timed from detection, does not. (Differences of event times, not speed.)
    assert failure["stall_seconds"] - failure["recovery_seconds"] >= 1.99


def test_worker_frozen_in_a_gil_holding_call_is_detected_by_silence(tmp_path, reference_weights):
    job = run_job(tmp_path, chaos=("freeze:rank=2:step=5",), steps=STEPS, launcher_args=FAST_HANG)
    summary = _assert_clean_recoveries(job, failures=1)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
    (failure,) = injected_failures(summary)
    assert failure["rank"] == 2 and "heartbeat silent" in failure["detected_by"]


@pytest.mark.parametrize(
    "second",
    ["kill:rank=0:step=4:phase=transfer", "kill:rank=1:step=4:phase=transfer"],
    ids=["source-dies-in-transfer", "spare-dies-while-receiving"],
)
def test_death_during_recovery_is_folded_into_one_recovery(tmp_path, reference_weights, second):
    job = run_job(tmp_path, spares=2, chaos=("kill:rank=1:step=4", second), steps=STEPS)
    _assert_clean_recoveries(job, failures=2)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
    events = [e["event"] for e in job.ledger()]
    assert events.count("recovery_superseded") == 1 and events.count("recovery_done") == 1


def test_death_inside_the_communicators_rendezvous_releases_the_others(tmp_path, reference_weights):
    # Rank 0 meets its peers on the store, then dies before it connects: they wait inside
    # gloo's rendezvous, which nothing interrupts. It must let them go well before the halt
    # timeout (else they never halt and the job fails there), and the next plan recovers.
    chaos = ("kill:rank=1:step=4", "kill:rank=0:step=4:phase=rendezvous")
    halt = ("--halt-timeout", "60")
    job = run_job(tmp_path, spares=2, chaos=chaos, steps=STEPS, launcher_args=halt)
    _assert_clean_recoveries(job, failures=2)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
    events = [e["event"] for e in job.ledger()]
    assert events.count("recovery_superseded") == 1 and events.count("recovery_done") == 1


@pytest.mark.parametrize("lost", [0, 1])
def test_a_loss_during_set_up_is_recovered(tmp_path, reference_weights, lost):
    # A rank dies after init(), before DDP's constructor has synchronised the model: the
    # others' set-up collectives are answered locally once the generation is aborted, so
    # their set-up completes, and they recover at their first step from the lowest survivor.
    job = run_job(tmp_path, spares=1, steps=STEPS, script_args=("--die-in-setup", str(lost)))
    summary = _assert_clean_recoveries(job, failures=1)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS), job)
    (failure,) = injected_failures(summary)
    assert failure["rank"] == lost and failure["step"] == 0
    (planned,) = [e for e in job.ledger() if e["event"] == "recovery_planned"]
    source = min({0, 1, 2} - {lost})
    assert planned["target_step"] == -1 and planned["sources"] == [source]
    assert planned["receivers"] == sorted({0, 1, 2} - {source})


def test_death_inside_the_first_rendezvous_is_recovered(tmp_path, reference_weights):
    # Rank 1 dies in the job's first rendezvous, after meeting its peers on the store: they
    # leave gloo's rendezvous at its bound, set up without a communicator (the abort came)
    # and recover at their first step.
    chaos = ("kill:rank=1:step=0:phase=rendezvous",)
    halt = ("--halt-timeout", "40")
    job = run_job(tmp_path, spares=1, chaos=chaos, steps=STEPS, launcher_args=halt)
    _assert_clean_recoveries(job, failures=1)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS), job)
    (planned,) = [e for e in job.ledger() if e["event"] == "recovery_planned"]
    assert planned["target_step"] == -1 and planned["sources"] == [0]


def test_losing_the_last_replica_stops_with_a_clear_reason(tmp_path):
    """Rank 0 dies in step 3, and rank 1, its only replica, during the transfer that follows.
    Rank 1 halts having committed step 2, or under load step 1 (its commit of step 2 may not
    have come yet), so that recovery resumes at step 3 or 2: a kill waits at each."""
    during_transfer = ("kill:rank=1:step=2:phase=transfer", "kill:rank=1:step=3:phase=transfer")
    job = run_job(
        tmp_path, nproc=2, spares=2, steps=STEPS, chaos=("kill:rank=0:step=3", *during_transfer)
    )
    assert job.returncode == 1
    end = [e for e in job.ledger() if e["event"] == "job_end"][-1]
    assert "no live replica survives" in end["reason"]


def test_straggler_is_reported_with_its_slowdown(tmp_path, reference_weights):
    steps = 30  # long enough for a few heartbeats to carry the slow medians
    job = run_job(tmp_path, chaos=("slow:rank=2:step=2:seconds=0.05",), steps=steps)
    summary = _assert_clean_recoveries(job, failures=0)
    assert [s["slot"] for s in summary["stragglers"]] == [2]
    assert summary["stragglers"][0]["slowdown"] > 1.5
    assert_bitwise_equal(job.weights(), reference_weights(steps))


def test_soak_of_thirty_mixed_failures_stays_bitwise_equal(tmp_path, reference_weights):
    steps = 100
    chaos = random_schedule(
        seed=2026,
        failures=30,
        world_size=3,
        first_step=2,
        last_step=steps - 2,
        hangs=3,
        during_recovery=3,
        stalls=2,
        drops=2,
    )
    job = run_job(
        tmp_path, spares=3, chaos=tuple(chaos), steps=steps, launcher_args=FAST_HANG, timeout=900
    )
    assert job.returncode == 0, job.output[-3000:]
    summary = job.summary()
    assert summary["chaos_fired"] == 30
    assert len(summary["failures"]) >= 30
    assert all(f["recovered"] and f["lost_steps"] == 0 for f in summary["failures"])
    assert_bitwise_equal(job.weights(), reference_weights(steps))
    busy = summary["wall_seconds"]
    print(
        f"soak: {len(summary['failures'])} failures in {busy:.0f} s "
        f"({60 * len(summary['failures']) / busy:.1f} per minute)"
    )


def test_stalled_worker_that_still_heartbeats_is_fenced_and_replaced(tmp_path, reference_weights):
    job = run_job(tmp_path, chaos=("stall:rank=1:step=4",), steps=STEPS, launcher_args=FAST_HANG)
    summary = _assert_clean_recoveries(job, failures=1)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
    (failure,) = injected_failures(summary)
    assert failure["kind"] == "stall" and failure["rank"] == 1
    assert "without waiting on a collective" in failure["detected_by"]
    # Its heartbeats never stopped: only the step-progress rule could see it.
    (detected,) = [e for e in job.ledger() if e["event"] == "hang_detected"]
    assert detected["detection"] == "stall" and detected["silent_seconds"] < 2.0
    # Fenced only once it had dumped its threads' stacks into its log: the training thread
    # blocked in the injected stall, the heartbeat thread beside it.
    log = (tmp_path / "logs" / f"{detected['process']}.log").read_bytes()
    require_built()
    assert log.endswith(END)
    assert b"in _inject" in log and b"in _heartbeat" in log


def test_collective_that_never_returns_is_cured_by_reforming_the_same_members(
    tmp_path, reference_weights
):
    job = run_job(tmp_path, chaos=("drop:rank=0:step=4",), steps=STEPS, launcher_args=FAST_HANG)
    summary = _assert_clean_recoveries(job, failures=1)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
    (failure,) = injected_failures(summary)
    assert failure["kind"] == "collective" and failure["rank"] is None
    assert failure["recomputed_steps"] == 1 and failure["bytes_transferred"] == 0
    (planned,) = [e for e in job.ledger() if e["event"] == "recovery_planned"]
    assert planned["replaced"] == {} and planned["receivers"] == []
    assert not [e for e in job.ledger() if e["event"] == "process_exit" and e["returncode"]]


def test_declared_long_evaluation_on_one_rank_is_not_a_stall(tmp_path, reference_weights):
    evaluation = ("--eval-rank", "0", "--eval-step", "5", "--eval-seconds", "4")
    job = run_job(tmp_path, steps=STEPS, launcher_args=FAST_HANG, script_args=evaluation)
    _assert_clean_recoveries(job, failures=0)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))


def test_a_stall_that_comes_back_on_every_replacement_stops_the_job(tmp_path):
    evaluation = ("--eval-rank", "0", "--eval-step", "5", "--eval-seconds", "30")
    job = run_job(
        tmp_path,
        steps=STEPS,
        spares=2,
        launcher_args=(*FAST_HANG, "--max-restarts", "1"),
        script_args=(*evaluation, "--eval-declared", "0"),
    )
    assert job.returncode == 1
    end = [e for e in job.ledger() if e["event"] == "job_end"][-1]
    assert "failed 2 times (last: a stall" in end["reason"] and "bug in the script" in end["reason"]
