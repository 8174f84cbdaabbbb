"""The recovery's decisions, step by step, as a pure function of the state and the clock."""

from __future__ import annotations

import pytest

from tests.fsm import Driver
from torchrelay.control.actions import SendToNode, SignalLocal, StartLocalSpare
from torchrelay.control.protocol import Seated
from torchrelay.control.state import JobPhase, MemberState, RecoveryStep


def fail_worker1(driver: Driver) -> float | None:
    driver.exit("worker1", -9)
    return driver.advance()


def test_a_recovery_runs_from_the_failure_to_the_first_step(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    wake = fail_worker1(driver)
    assert driver.sent("worker0") == [{"type": "abort", "generation": 0}]
    assert SignalLocal("worker1", 9) in driver.actions
    (start,) = driver.events("recovery_start")
    assert start == {"generation": 0, "slots": [1], "t": driver.now}
    assert wake == driver.now + driver.config.halt_timeout  # the spare was ready: halts next

    driver.now += 1
    driver.report("worker0", "halted", committed=2, in_flight=3, last_commit_t=999.5)
    assert driver.advance() is not None  # the plan is out, waiting for the first steps
    (planned,) = driver.events("recovery_planned")
    assert planned["generation"] == 1 and planned["replaced"] == {"1": "spare0"}
    plan = driver.sent("spare0")[-1]
    assert plan["type"] == "plan" and plan["slot"] == 1 and plan["receivers"] == [1]
    assert driver.job.members["spare0"].state is MemberState.ACTIVE
    assert StartLocalSpare() not in driver.actions  # not while the recovery runs

    driver.now += 1
    for process in ("worker0", "spare0"):
        driver.report(process, "progress", step=3, first_after_recovery=True, t=driver.now)
    assert driver.advance() is None
    (done,) = driver.events("recovery_done")
    assert done["slots"] == [1] and done["target_step"] == 2
    assert done["recomputed_steps"] == 1  # step 3 was in flight on worker0: done again
    assert done["recovery_seconds"] == 2.0 and done["survivor_gap_seconds"] == {"0": 2.5}
    assert driver.job.recovery.current is None
    assert StartLocalSpare() in driver.actions  # the spares are topped up after it


@pytest.mark.parametrize("node", ["node0", "node1"])
def test_the_node_of_a_spare_that_takes_a_slot_hears_which_unless_it_is_the_controllers(
    tmp_path, node
):
    """Its agent shows the spare's output as that rank's (agent.console); the controller's
    own agent reads the slot from the job's state instead."""
    driver = Driver(tmp_path)
    driver.start(spare=False)
    driver.join("spare0", role="spare", node=node)
    driver.report("spare0", "ready")
    fail_worker1(driver)
    driver.report("worker0", "halted", committed=2, in_flight=3, last_commit_t=999.5)
    driver.advance()
    assert driver.sent("spare0")[-1]["slot"] == 1
    told = [a for a in driver.actions if isinstance(a, SendToNode)]
    assert told == ([] if node == "node0" else [SendToNode(node, Seated(process="spare0", slot=1))])


def test_a_recovery_with_no_spare_coming_is_abandoned_naming_the_step_in_flight(tmp_path):
    driver = Driver(tmp_path, spares=0)
    driver.start(steps=2, spare=False)
    wake = fail_worker1(driver)
    assert driver.job.recovery.current.step is RecoveryStep.ABANDON
    assert wake == driver.now + driver.config.halt_timeout and driver.outcome() is None
    driver.report("worker0", "halted", committed=3, in_flight=4)  # it had committed one more
    assert driver.advance() is None
    (abandoned,) = driver.events("recovery_abandoned")
    assert abandoned["step"] == 4 and abandoned["slots"] == [1]
    outcome = driver.outcome()
    assert outcome is not None and outcome["status"] == "failed"
    assert outcome["reason"] == abandoned["reason"] and "step 4" in outcome["reason"]


@pytest.mark.parametrize("committed", [2, -1], ids=["training", "setting-up"])
def test_a_survivor_that_never_halts_is_fenced_with_its_stacks_and_the_job_fails(
    tmp_path, committed
):
    driver = Driver(tmp_path)
    driver.start(steps=committed)
    wake = fail_worker1(driver)
    assert SignalLocal("worker0", 9, stacks=True) not in driver.actions
    driver.now = wake  # worker0 never reports its halt
    assert driver.advance() is None
    assert SignalLocal("worker0", 9, stacks=True) in driver.actions
    outcome = driver.outcome()
    assert outcome is not None and outcome["status"] == "failed"
    assert "slot(s) [0] did not stop their step" in outcome["reason"]
    assert "their logs end with their stacks" in outcome["reason"]
    # Before any commit, survivors that cannot halt were most likely setting up.
    assert ("still setting up" in outcome["reason"]) == (committed < 0)


def test_a_script_failure_after_a_loss_in_set_up_names_the_loss(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=-1)
    fail_worker1(driver)
    driver.exit("worker0", 1)  # its set-up collective failed with worker1
    driver.advance()
    outcome = driver.outcome()
    assert outcome is not None and outcome["status"] == "failed"
    assert outcome["reason"].startswith("rank 1 (worker1) was lost (")
    assert "rank 0 (worker0) then failed in its set-up" in outcome["reason"]
    assert "a bug in the script" not in outcome["reason"]


def publish_plan(tmp_path) -> Driver:
    """worker1 fails; worker0 halts; the plan of generation 1 (spare0 for slot 1) is out."""
    driver = Driver(tmp_path)
    driver.start(steps=2)
    fail_worker1(driver)
    driver.report("worker0", "halted", committed=2)
    driver.advance()
    return driver


def test_a_halted_report_during_a_published_plan_makes_a_new_plan(tmp_path):
    driver = publish_plan(tmp_path)
    driver.report("spare0", "halted", committed=-1, valid=False, reason="transfer failed")
    assert driver.job.recovery.replan == "transfer failed"
    (failed,) = driver.events("recovery_failed")
    assert failed["process"] == "spare0" and failed["generation"] == 1
    driver.advance()
    assert driver.events("recovery_superseded") == [{"generation": 1}]
    starts = driver.events("recovery_start")
    assert [s["generation"] for s in starts] == [0, 1] and starts[1]["slots"] == []
    assert driver.job.recovery.replans == 1
    assert driver.sent("worker0")[-1] == {"type": "abort", "generation": 1}


def test_a_plan_not_carried_out_in_time_is_replanned_then_given_up(tmp_path):
    driver = Driver(tmp_path, max_restarts=0)
    driver.start(steps=2)
    fail_worker1(driver)
    driver.report("worker0", "halted", committed=2)
    deadline = driver.advance()
    assert deadline is not None
    driver.now = deadline
    assert driver.advance() is None
    (failed,) = driver.events("recovery_failed")
    assert "never reported comm_ready" in failed["reason"]
    outcome = driver.outcome()
    assert outcome is not None and "recovery failed 1 times in a row" in outcome["reason"]
    assert driver.job.phase is JobPhase.FAILED


def test_no_spare_ready_in_time_fails_with_the_spare_timeout(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2, spare=False)
    driver.join("spare0", role="spare")  # joined but never ready
    deadline = fail_worker1(driver)
    assert deadline == driver.now + driver.config.spare_timeout
    driver.now = deadline - 0.1
    assert driver.advance() == deadline  # still in time: wait on
    driver.now = deadline
    driver.advance()
    outcome = driver.outcome()
    assert outcome is not None and "no spare became ready within 60 s" in outcome["reason"]


def test_a_failure_before_the_plan_starts_over_with_both_failures(tmp_path):
    driver = Driver(tmp_path, spares=2)
    driver.start(steps=2, spare=False)
    driver.join("spare0", role="spare")
    fail_worker1(driver)  # waits for a ready spare
    driver.report("worker0", "progress", step=3)
    driver.exit("worker0", -9)
    driver.advance()
    starts = driver.events("recovery_start")
    assert [s["slots"] for s in starts] == [[1], [0, 1]]
    current = driver.job.recovery.current
    assert current is not None and current.step is RecoveryStep.SPARES
    assert [f["slot"] for f in current.failures] == [1, 0]  # each failure once


def test_a_phase_report_of_a_superseded_plan_is_ignored_not_refused(tmp_path):
    # A source's transfer_done still on its way when the receiver's failure superseded the
    # plan: the source is healthy and the next plan counts on it, so its report is dropped.
    driver = publish_plan(tmp_path)
    driver.report("worker0", "phase", phase="comm_ready", t=driver.now)
    assert list(driver.job.recovery.current.phases) == ["comm_ready"]  # of the live plan
    driver.report("spare0", "halted", committed=-1, valid=False, reason="transfer failed")
    driver.advance()
    assert driver.events("recovery_superseded") == [{"generation": 1}]
    assert driver.report("worker0", "phase", phase="transfer_done", generation=1) == []
    assert driver.job.recovery.current.phases == {}
    assert driver.job.phase is not JobPhase.FAILED
