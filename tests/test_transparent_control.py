"""Transparent mode's recovery decisions, as pure transitions: a dead slot rebuilt by cloning a
live replica, a drained worker moved into a copy of itself, and the ways they give up."""

from __future__ import annotations

from tests.fsm import Driver
from torchrelay.control import handover, transparent
from torchrelay.control.actions import CloneReplica, MigrateWorker
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
    driver.take(transparent.copied(driver.job, cloned(driver, "worker0", 1)))
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
    driver.take(transparent.copied(driver.job, failed))
    driver.advance()
    outcome = driver.outcome()
    assert outcome is not None and outcome["status"] == "failed"
    assert "could not clone a live replica" in outcome["reason"]
    assert "\n" not in outcome["reason"] and driver.events("copy_failed")


def test_no_donor_on_the_controllers_node_means_no_clone(tmp_path):
    driver = started(tmp_path)
    driver.job.members["worker0"].node = "node1"
    driver.exit("worker1", -9)
    driver.advance()
    assert not ordered(driver, CloneReplica)
    driver.report("worker0", "halted", committed=10, in_flight=11)
    driver.advance()
    assert driver.outcome() is not None and driver.events("recovery_abandoned")


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
    driver.take(transparent.copied(driver.job, moved))
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
    driver.take(transparent.copied(driver.job, failed))
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
    driver.take(transparent.copied(driver.job, cloned(driver, "worker0", 1)))
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
