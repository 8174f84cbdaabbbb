"""The monitor's and the drills' decisions as pure transitions over a hand-driven state."""

from __future__ import annotations

import signal

import pytest

from tests.fsm import MAX_STEPS, Driver
from torchrelay.chaos import ChaosEvent
from torchrelay.control import drills, liveness, nodes
from torchrelay.control.actions import SendToNode, SignalLocal, StartRecovery
from torchrelay.control.errors import ProtocolError
from torchrelay.control.protocol import Chaos
from torchrelay.control.state import Detection, MemberState, RecoveryStep


def tick(driver: Driver) -> list:
    return driver.take(liveness.tick(driver.job, driver.config, driver.now, driver.tails.get))


def test_a_silent_worker_is_fenced_then_its_exit_is_a_heartbeat_failure(tmp_path):
    driver = Driver(tmp_path, hang_floor=5.0)
    driver.start(steps=2)
    driver.now += 6.0
    driver.report("worker0", "progress", step=2)  # worker1 stays silent
    actions = tick(driver)
    (hang,) = driver.events("hang_detected")
    assert hang["process"] == "worker1" and hang["detection"] == "heartbeat"
    # Its stacks are dumped into its log before the SIGKILL (torchrelay.stack_dump).
    assert SignalLocal("worker1", signal.SIGKILL, stacks=True) in actions
    assert driver.job.members["worker1"].state is MemberState.FENCING
    assert tick(driver) == []  # fenced once
    driver.exit("worker1", -9)
    (failure,) = driver.events("failure")
    assert failure["onset"] == driver.now - 6.0 and failure["kind"] == "signal"
    assert driver.job.members["worker1"].detection is Detection.HEARTBEAT


def test_a_fenced_worker_that_ends_its_training_before_its_kill_is_still_recovered(tmp_path):
    """The stack dump before a fence's SIGKILL can wake a hung call (a signal ends a sleep),
    and the worker may finish its last steps before the kill lands: its done report is not
    taken, so the job does not end before the kill (which would fail it "after its last
    step"); the kill is a failure like any other, and the job waits for its recovery."""
    driver = Driver(tmp_path, hang_floor=5.0)
    driver.start(steps=2)
    driver.now += 6.0
    driver.report("worker0", "progress", step=2)  # worker1 stays silent
    tick(driver)
    assert driver.job.members["worker1"].state is MemberState.FENCING
    last = MAX_STEPS - 1
    driver.report("worker0", "done", step=last)
    driver.report("worker1", "done", step=last)  # woken by the dump, before its kill
    assert driver.job.members["worker1"].state is MemberState.FENCING
    assert not driver.events("training_done") and driver.outcome() is None
    driver.exit("worker1", -9)
    (failure,) = driver.events("failure")
    assert failure["process"] == "worker1" and driver.outcome() is None
    driver.advance()  # worker0, done, serves the recovery (Relay._finish): halted, then plan
    driver.report("worker0", "halted", committed=last)
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["replaced"] == {"1": "spare0"} and planned["target_step"] == last


def test_a_lost_collective_reforms_the_same_members_until_max_restarts(tmp_path):
    driver = Driver(tmp_path, hang_floor=5.0, max_restarts=1)
    driver.start(steps=2)
    for _ in range(2):
        for slot in (0, 1):
            body = {"step": 2, "step_age": 7.0, "waiting": 6.0, "step_seconds": 0.1}
            driver.report(f"worker{slot}", "progress", **body)
        actions = tick(driver)
        if driver.outcome() is None:
            assert actions[-1] == StartRecovery()
            assert driver.job.recovery.reform["kind"] == "collective"
            driver.advance()  # a round that replaces nobody: both are survivors
            current = driver.job.recovery.current
            assert current.slots == [] and current.survivors == ["worker0", "worker1"]
            assert current.step is RecoveryStep.HALT
            driver.job.recovery.current = None  # as if it completed
    assert [f["kind"] for f in driver.events("failure")] == ["collective", "collective"]
    assert "never completed, even after re-forming" in driver.outcome()["reason"]


def test_a_silent_node_is_declared_lost_after_the_node_timeout(tmp_path):
    driver = Driver(tmp_path, node_timeout=10.0)
    driver.start(steps=2)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    driver.now += 10.0
    assert tick(driver) == []
    driver.now += 0.5
    tick(driver)
    (lost,) = driver.events("node_lost")
    assert lost["node"] == "node1" and "no heartbeat for 10.5 s" in lost["reason"]


def test_a_straggler_is_recorded_once(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    driver.report("worker0", "progress", step=2, compute_seconds=0.1)
    driver.report("worker1", "progress", step=2, compute_seconds=0.5)
    tick(driver)
    tick(driver)
    (straggler,) = driver.events("straggler")
    assert straggler["slot"] == 1 and straggler["slowdown"] == 5.0


def test_a_scheduled_node_fault_goes_out_once_its_step_runs(tmp_path):
    driver = Driver(tmp_path)
    driver.job.chaos_pending = {0: ChaosEvent(0, "kill-node", -1, 4, node=1)}
    driver.start(steps=1)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    driver.report("worker0", "progress", step=2)
    assert driver.events("chaos_fired") == []
    driver.report("worker0", "progress", step=3)  # step 4 runs now
    assert driver.actions[-1] == SendToNode("node1", Chaos(fault="kill-node", seconds=0.0))
    assert driver.job.chaos_pending == {}


def test_node_drills_are_refused_on_the_controllers_node_and_on_lost_nodes(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=1)
    with pytest.raises(ProtocolError, match="hosts the controller"):
        drills.inject_node(driver.job, "kill-node", "node0", 0.0)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    with pytest.raises(ProtocolError, match="between 1 and 3600"):
        drills.inject_node(driver.job, "partition", "node1", 0.5)
    driver.job.nodes["node1"].alive = False
    with pytest.raises(ProtocolError, match="already lost"):
        drills.inject_node(driver.job, "kill-node", "node1", 0.0)
    assert drills.inject_process(driver.job, "hang", "worker0")[-1] == SignalLocal(
        "worker0", signal.SIGSTOP
    )


def test_the_peer_median_equals_statistics_median_of_the_others():
    import random
    import statistics

    from torchrelay.control.liveness import median_without

    rng = random.Random(5)
    for size in range(2, 40):
        values = [rng.choice([0.1, 0.2, 0.25, rng.random()]) for _ in range(size)]
        ordered = sorted(values)
        for i, value in enumerate(values):
            others = values[:i] + values[i + 1 :]
            assert median_without(ordered, value) == statistics.median(others)
