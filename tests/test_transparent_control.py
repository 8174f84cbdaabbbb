"""Transparent mode's recovery decisions, as pure transitions: a dead slot rebuilt by cloning a
live replica, a drained worker moved into a copy of itself, and the ways they give up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.fsm import Driver
from torchrelay.control import departures, handover, membership, nodes, transparent
from torchrelay.control.actions import CloneReplica, MigrateWorker, SendToNode
from torchrelay.control.errors import ProtocolError
from torchrelay.control.protocol import CopyProcess, JoinRequest
from torchrelay.control.state import MemberState
from torchrelay.events_criu import CopyFailed, ReplicaCloned, WorkerMigrated

LONG = 100


def started(tmp_path) -> Driver:
    """A --transparent job (no spare): two workers at step 10, timed."""
    driver = Driver(tmp_path, spares=0, transparent=True)
    for slot in (0, 1):
        driver.join(f"worker{slot}", slot=slot)
        driver.report(f"worker{slot}", "max_steps", max_steps=LONG)
        driver.report(f"worker{slot}", "progress", step=10, step_seconds=0.05)
    return driver


def ordered(driver: Driver, kind: type) -> list:
    return [a for a in driver.actions if isinstance(a, kind)]


def cloned(driver: Driver, donor: str, slot: int) -> ReplicaCloned:
    now = driver.now
    return ReplicaCloned(
        donor=donor,
        process="spare0",
        slot=slot,
        generation=0,
        ordered=now,
        parked=now + 0.1,
        dumped=now + 0.5,
        restored=now + 0.8,
        bytes=200_000_000,
        dump_seconds=0.4,
        restore_seconds=0.3,
    )


def test_a_dead_slot_is_rebuilt_by_a_clone_of_a_survivor_that_joins_as_a_spare(tmp_path):
    driver = started(tmp_path)
    driver.exit("worker1", -9)
    wake = driver.advance()
    assert wake is not None  # waiting for the clone, as for a spare on its way
    assert driver.sent("worker0") == [
        {"type": "abort", "generation": 0},
        {"type": "park", "generation": 0},
    ]
    [clone] = ordered(driver, CloneReplica)
    assert (clone.donor, clone.slot, clone.generation) == ("worker0", 1, 0)
    assert driver.job.spares_launching == {"node0": 1}

    driver.report("worker0", "halted", committed=10, in_flight=11)
    driver.take(transparent.copied(driver.job, cloned(driver, "worker0", 1), "node0"))
    assert driver.advance() is not None and not driver.events("recovery_planned")
    driver.join("spare0", role="spare")  # the copy, released with BECOME
    driver.report("spare0", "ready")
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["replaced"] == {"1": "spare0"} and planned["lost_steps"] == 0
    assert (planned["sources"], planned["receivers"]) == ([0], [1])

    driver.now += 1
    for process in ("worker0", "spare0"):
        driver.report(process, "progress", step=11, first_after_recovery=True, t=driver.now)
    assert driver.advance() is None
    (done,) = driver.events("recovery_done")
    assert done["bytes_transferred"] == 200_000_000 and done["recomputed_steps"] == 1
    timeline = done["timeline"]
    assert timeline["parked"] <= timeline["dumped"] <= timeline["restored"]
    assert driver.events("replica_cloned")[0]["donor"] == "worker0"


def test_a_failed_clone_ends_the_job_with_one_line_saying_so(tmp_path):
    driver = started(tmp_path)
    driver.exit("worker1", -9)
    driver.advance()
    driver.report("worker0", "halted", committed=10, in_flight=11)
    failed = CopyFailed(process="worker0", kind="clone", reason="criu dump failed: ...")
    driver.take(transparent.copied(driver.job, failed, "node0"))
    driver.advance()
    outcome = driver.outcome()
    assert outcome is not None and outcome["status"] == "failed"
    assert "could not clone a live replica" in outcome["reason"]
    assert "\n" not in outcome["reason"] and driver.events("copy_failed")


def test_no_live_survivor_means_no_clone(tmp_path):
    driver = started(tmp_path)
    driver.exit("worker1", -9)
    driver.exit("worker0", -9)
    driver.advance()
    assert not ordered(driver, CloneReplica) and not ordered(driver, SendToNode)
    driver.advance()
    assert driver.outcome() is not None and driver.events("recovery_abandoned")


def test_donors_are_taken_on_every_node_the_dead_slots_own_first(tmp_path):
    driver = Driver(tmp_path, spares=0, transparent=True, nproc_per_node=5)
    for slot, node in enumerate(["node0", "node1", "node1", "node2", "node0"]):
        driver.join(f"worker{slot}", slot=slot)
        driver.job.members[f"worker{slot}"].node = node
    live = driver.job.slot_members()
    names = lambda near: [m.process for m in transparent.donors(driver.job, live, near)]  # noqa: E731
    # Its own node first (highest slot there), then the controller's, then the others by name.
    assert names(["node1"]) == ["worker2"]
    assert names(["node2"]) == ["worker3"]
    assert names(["node3"]) == ["worker4"]  # a node with no survivor: the controller's
    # Several slots: each the least used donor first, so copies spread before they pile up.
    assert names(["node1", "node1", "node1"]) == ["worker2", "worker1", "worker4"]
    assert names([None] * 6) == ["worker4", "worker0", "worker2", "worker1", "worker3", "worker4"]
    driver.job.members["worker4"].state = MemberState.DEAD
    assert names([None]) == ["worker0"]
    assert transparent.donors(driver.job, [], ["node0"]) == []


def two_nodes(tmp_path) -> Driver:
    """A --transparent job of two nodes, one worker each: worker0 on node0 (the controller's),
    worker1 on node1; at step 10."""
    driver = Driver(tmp_path, spares=0, transparent=True, nproc_per_node=1, nnodes=2)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    for slot, node in ((0, "node0"), (1, "node1")):
        join_on(driver, f"worker{slot}", node, slot)
        driver.report(f"worker{slot}", "max_steps", max_steps=LONG)
        driver.report(f"worker{slot}", "progress", step=10, step_seconds=0.05)
    return driver


def join_on(driver: Driver, process: str, node: str, slot: int | None) -> None:
    role = "worker" if slot is not None else "spare"
    request = JoinRequest(role=role, pid=1, node=node, slot=slot)
    driver.take(membership.join(driver.job, driver.config, process, request, driver.now))


def test_a_donor_on_another_node_is_cloned_there_by_its_own_agent(tmp_path):
    driver = two_nodes(tmp_path)
    driver.exit("worker0", -9)
    driver.advance()
    assert not ordered(driver, CloneReplica)  # not the controller's agent: node1's
    [sent] = [a for a in ordered(driver, SendToNode) if isinstance(a.command, CopyProcess)]
    assert sent.node == "node1"
    assert sent.command == CopyProcess(
        kind="clone", process="worker1", slot=0, generation=0, ordered=driver.now
    )
    assert {"type": "park", "generation": 0} in driver.sent("worker1")
    assert driver.job.spares_launching.get("node1") == 1  # a spare of the donor's node

    driver.report("worker1", "halted", committed=10, in_flight=11)
    copy = replace(cloned(driver, "worker1", 0), process="node1-spare0")
    with pytest.raises(ProtocolError, match="no process of node 'node0'"):
        transparent.copied(driver.job, copy, "node0")  # only node1's agent speaks for worker1
    driver.take(transparent.copied(driver.job, copy, "node1"))
    join_on(driver, "node1-spare0", "node1", None)
    assert driver.job.spares_launching.get("node1") == 0
    driver.report("node1-spare0", "ready")
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["replaced"] == {"0": "node1-spare0"} and planned["lost_steps"] == 0


def test_a_failed_remote_clone_ends_the_job_as_a_local_one_does(tmp_path):
    driver = two_nodes(tmp_path)
    driver.exit("worker0", -9)
    driver.advance()
    driver.report("worker1", "halted", committed=10, in_flight=11)
    failed = CopyFailed(process="worker1", kind="clone", reason="criu dump failed: ...")
    driver.take(transparent.copied(driver.job, failed, "node1"))
    assert driver.job.spares_launching.get("node1") == 0
    driver.advance()
    outcome = driver.outcome()
    assert outcome is not None and "could not clone a live replica" in outcome["reason"]


def test_a_node_lost_in_the_middle_of_its_copy_ends_the_wait_for_it(tmp_path):
    driver = two_nodes(tmp_path)
    driver.exit("worker0", -9)
    driver.advance()
    assert driver.job.spares_launching.get("node1") == 1
    lost = departures.node_lost(
        driver.job, driver.config, "node1", "no heartbeat", driver.now, driver.tails.get
    )
    driver.take(lost)
    assert "node1" not in driver.job.spares_launching  # no spare comes from there
    driver.advance()
    outcome = driver.outcome()  # no survivor is left: the job ends, it does not wait
    assert outcome is not None and outcome["status"] == "failed"


def test_a_drained_worker_of_another_node_is_moved_by_its_own_agent(tmp_path):
    driver = two_nodes(tmp_path)
    driver.take(handover.request(driver.job, [1], "drain", driver.now, driver.now))
    driver.advance()
    for process in ("worker0", "worker1"):
        driver.report(process, "halted", committed=27)
    driver.advance()
    assert not ordered(driver, MigrateWorker)
    [sent] = [a for a in ordered(driver, SendToNode) if isinstance(a.command, CopyProcess)]
    assert (sent.node, sent.command.kind, sent.command.process) == ("node1", "migrate", "worker1")
    copied = {k: v for k, v in vars(cloned(driver, "worker1", 1)).items() if k != "donor"}
    moved = WorkerMigrated(**{**copied, "process": "worker1"})
    driver.take(transparent.copied(driver.job, moved, "node1"))
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["replaced"] == {} and driver.outcome() is None


def test_a_drain_moves_the_worker_into_a_copy_of_itself_without_a_spare(tmp_path):
    driver = started(tmp_path)
    driver.take(handover.request(driver.job, [1], "drain", driver.now, driver.now))
    driver.advance()
    told = {"type": "handover", "generation": 0, "step": 27}
    assert driver.sent("worker0") == [told] and driver.sent("worker1") == [told]

    driver.now += 1
    for process in ("worker0", "worker1"):
        driver.report(process, "halted", committed=27)
    driver.advance()
    assert driver.sent("worker1")[-1] == {"type": "park", "generation": 0}
    [move] = ordered(driver, MigrateWorker)
    assert (move.process, move.slot) == ("worker1", 1) and not driver.events("recovery_planned")

    driver.now += 1
    moved = WorkerMigrated(
        process="worker1",
        slot=1,
        generation=0,
        ordered=driver.now - 1,
        parked=driver.now - 0.9,
        dumped=driver.now - 0.5,
        restored=driver.now,
        bytes=300_000_000,
        dump_seconds=0.4,
        restore_seconds=0.5,
    )
    driver.take(transparent.copied(driver.job, moved, "node0"))
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["replaced"] == {} and planned["receivers"] == []
    assert {"type": "retire"} not in driver.sent("worker1")
    assert driver.job.members["worker1"].state is MemberState.ACTIVE

    driver.now += 1
    for process in ("worker0", "worker1"):
        driver.report(process, "progress", step=28, first_after_recovery=True, t=driver.now)
    assert driver.advance() is None
    (done,) = driver.events("handover_done")
    assert (done["recomputed_steps"], done["lost_steps"], done["retired"]) == (0, 0, [])
    assert done["bytes_transferred"] == 300_000_000 and done["stall_seconds"] == 2.0


def test_a_failed_dump_leaves_the_drained_worker_where_it_was(tmp_path):
    driver = started(tmp_path)
    driver.take(handover.request(driver.job, [1], "drain", driver.now, driver.now))
    driver.advance()
    for process in ("worker0", "worker1"):
        driver.report(process, "halted", committed=27)
    driver.advance()
    failed = CopyFailed(process="worker1", kind="migrate", reason="criu dump failed: ...")
    driver.take(transparent.copied(driver.job, failed, "node0"))
    driver.advance()
    (planned,) = driver.events("recovery_planned")  # the same members go on
    assert planned["replaced"] == {} and driver.outcome() is None


def test_a_migration_that_never_ends_fails_the_job(tmp_path):
    driver = started(tmp_path)
    driver.take(handover.request(driver.job, [1], "drain", driver.now, driver.now))
    driver.advance()
    for process in ("worker0", "worker1"):
        driver.report(process, "halted", committed=27)
    wake = driver.advance()
    assert wake == driver.now + driver.config.halt_timeout
    driver.now = wake
    driver.advance()
    outcome = driver.outcome()
    assert outcome is not None and "migration of slot(s) [1]" in outcome["reason"]


def recovered(tmp_path) -> Driver:
    """A --transparent job after one recovery: worker1 died, spare0 (a clone of worker0) holds
    slot 1 and the job is at step 11."""
    driver = started(tmp_path)
    driver.exit("worker1", -9)
    driver.advance()
    driver.report("worker0", "halted", committed=10, in_flight=11)
    driver.take(transparent.copied(driver.job, cloned(driver, "worker0", 1), "node0"))
    driver.advance()
    driver.join("spare0", role="spare")
    driver.report("spare0", "ready")
    driver.advance()
    driver.now += 1
    for process in ("worker0", "spare0"):
        driver.report(process, "progress", step=11, first_after_recovery=True, t=driver.now)
    assert driver.advance() is None and driver.events("recovery_done")
    return driver


def test_a_copy_is_the_donor_when_it_is_the_only_survivor(tmp_path):
    driver = recovered(tmp_path)
    driver.exit("worker0", -9)
    driver.advance()
    clone = ordered(driver, CloneReplica)[-1]
    assert (clone.donor, clone.slot) == ("spare0", 0)
    assert {"type": "park", "generation": driver.job.generation} in driver.sent("spare0")
    assert driver.outcome() is None


def test_a_drain_of_a_slot_held_by_a_copy_moves_the_copy(tmp_path):
    driver = recovered(tmp_path)
    driver.take(handover.request(driver.job, [1], "drain", driver.now, driver.now))
    driver.advance()
    for process in ("worker0", "spare0"):
        driver.report(process, "halted", committed=27)
    driver.advance()
    [move] = ordered(driver, MigrateWorker)
    assert (move.process, move.slot) == ("spare0", 1)
