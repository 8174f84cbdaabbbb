"""Joins, reports and exits as pure transitions (no threads, sockets or processes)."""

from __future__ import annotations

import pytest

from tests.fsm import Driver, fields
from torchrelay.control import departures, nodes
from torchrelay.control.actions import (
    Refused,
    SendToNode,
    SignalLocal,
    StartLocalSpare,
    StartRecovery,
)
from torchrelay.control.errors import FencedError, IllegalTransition, ProtocolError
from torchrelay.control.protocol import FinishNode, NodeHeartbeat, Signal, StartSpare
from torchrelay.control.state import JobPhase, MemberState


def finish(driver: Driver) -> None:
    for slot in (0, 1):
        driver.report(f"worker{slot}", "done", step=4)


def test_a_worker_exit_during_training_is_a_failure_that_starts_a_recovery(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    actions = driver.exit("worker1", -9)
    (failure,) = driver.events("failure")
    assert failure["slot"] == 1 and failure["kind"] == "signal" and failure["step"] == 3
    assert failure["t"] == failure["onset"] == driver.now
    assert actions[-1] == StartRecovery()
    assert driver.job.recovery.failed[1] == failure
    assert driver.job.members["worker1"].state is MemberState.DEAD


def test_an_exit_after_training_with_all_zero_succeeds(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=3)
    finish(driver)
    assert driver.job.phase is JobPhase.FINISHING
    assert driver.events("training_done") == [{"steps_committed": 5}]
    assert all(driver.sent(p) == [{"type": "finish"}] for p in ("worker0", "worker1", "spare0"))
    driver.exit("worker0", 0)
    assert driver.outcome() is None
    driver.exit("worker1", 0)
    assert driver.outcome() == {"status": "succeeded", "steps_committed": 5}
    assert driver.job.phase is JobPhase.SUCCEEDED


def test_a_failed_save_after_training_fails_the_job_with_its_traceback(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=3)
    finish(driver)
    driver.tails["worker1"] = "OSError: disk full"
    driver.exit("worker1", 1)
    driver.exit("worker0", 0)
    outcome = driver.outcome()
    assert outcome is not None and outcome["status"] == "failed"
    assert outcome["traceback"] == "OSError: disk full" and "rank 1" in outcome["reason"]


def test_a_report_of_a_superseded_generation_is_refused_and_recorded(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    driver.job.generation = 1  # a recovery moved on without this worker
    with pytest.raises(Refused) as refused:
        driver.report("worker1", "progress", step=3)
    assert isinstance(refused.value.error, FencedError)
    (record,) = refused.value.actions
    assert record.event.TAG == "fenced_refused" and record.event.current_generation == 1


def test_a_claim_past_the_declared_steps_is_refused(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    with pytest.raises(Refused) as refused:
        driver.report("worker0", "progress", step=99)
    assert isinstance(refused.value.error, ProtocolError)
    assert refused.value.actions[0].event.TAG == "claim_refused"
    assert driver.job.members["worker0"].committed == 2


def test_reports_that_fit_no_state_are_refused(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    with pytest.raises(ProtocolError, match="reported ready but is active"):
        driver.report("worker0", "ready")
    driver.join("spare1", role="spare")
    with pytest.raises(IllegalTransition):
        driver.report("spare1", "halted", committed=0)
    with pytest.raises(ProtocolError, match="joined twice"):
        driver.join("worker0", slot=0)
    with pytest.raises(FencedError, match="only join at job start"):
        driver.join("worker9", slot=1)


def test_a_spare_lost_before_its_slot_is_replaced(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    assert driver.exit("spare0", -9)[-1] == StartLocalSpare()
    assert driver.events("spare_lost")[0]["process"] == "spare0"
    assert driver.job.spares_launching == {"node0": 1}


def test_a_lost_node_fences_its_processes_and_fails_their_slots(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    driver.job.members["worker1"].node = "node1"
    # While it lives, its agent is told to fence with a stack dump first where asked.
    assert nodes.signal(driver.job, "worker1", 9, stacks=True) == [
        SendToNode("node1", Signal(process="worker1", signal=9, stacks=True))
    ]
    actions = departures.node_lost(
        driver.job, driver.config, "node1", "gone", driver.now, driver.tails.get
    )
    assert fields(driver.take(actions)[0]) == {
        "node": "node1",
        "reason": "gone",
        "processes": ["worker1"],
    }
    (failure,) = driver.events("failure")
    assert failure["detected_by"] == "node node1 lost (gone)" and failure["kind"] == "signal"
    assert driver.job.members["worker1"].state is MemberState.FENCED
    assert not driver.job.nodes["node1"].alive
    # Nothing reaches the lost node any more; the local agent still gets its signals.
    assert nodes.signal(driver.job, "worker1", 9) == []
    assert nodes.signal(driver.job, "worker0", 9) == [SignalLocal("worker0", 9)]
    with pytest.raises(Refused) as refused:
        departures.node_report(driver.job, driver.config, "node1", NodeHeartbeat(), 0, str)
    assert isinstance(refused.value.error, FencedError)


def test_a_spare_goes_to_the_least_loaded_live_node(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    driver.exit("spare0", -9)
    assert driver.actions[-1] == SendToNode("node1", StartSpare())


def test_a_success_tells_each_node_which_of_its_processes_joined(tmp_path):
    """Its agent stops the others: spares still starting, which would only come up to be
    dismissed (the launcher waited seconds for them)."""
    driver = Driver(tmp_path)
    driver.start(steps=3)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    driver.job.spares_launching["node1"] = 1  # node1-spare0 is still importing torch
    driver.join("node1-spare1", role="spare")
    driver.job.members["node1-spare1"].node = "node1"
    finish(driver)
    driver.exit("worker0", 0)
    driver.exit("worker1", 0)
    assert driver.outcome() == {"status": "succeeded", "steps_committed": 5}
    assert driver.actions[-1] == SendToNode("node1", FinishNode(joined=("node1-spare1",)))


def test_a_spare_that_exits_before_joining_after_a_success_is_no_longer_on_its_way(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=3)
    driver.job.spares_launching["node0"] = 1  # a refill spare, still starting
    finish(driver)
    driver.exit("worker0", 0)
    driver.exit("worker1", 0)
    driver.exit("spare1", -15)  # stopped by its agent
    (exited,) = [e for e in driver.events("process_exit") if e["process"] == "spare1"]
    assert exited["note"] == "exited before joining"
    assert driver.job.spares_launching == {"node0": 0}
    assert driver.outcome() == {"status": "succeeded", "steps_committed": 5}
