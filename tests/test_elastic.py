"""Elastic shrink and regrow (``--elastic``), as pure decisions and transitions: who hosts a lost
slot, when a job may shrink, the shrink plan, the regrow onto a spare, an operator's release."""

from __future__ import annotations

import pytest

from tests.fsm import Driver
from torchrelay.control import elastic, handover, liveness
from torchrelay.control.errors import ProtocolError
from torchrelay.control.planner import PlanningError
from torchrelay.control.state import JobState, MemberState

LONG = 100


def test_hosts_are_the_least_loaded_survivors_and_several_orphans_spread():
    assert elastic.choose_hosts([1], {0: 0, 2: 0}) == {1: 0}
    assert elastic.choose_hosts([1, 3], {0: 0, 2: 0}) == {1: 0, 3: 2}
    assert elastic.choose_hosts([3], {0: 1, 2: 0}) == {3: 2}
    assert elastic.choose_hosts([1, 2, 3], {0: 0}) == {1: 0, 2: 0, 3: 0}
    with pytest.raises(PlanningError, match="no live replica"):
        elastic.choose_hosts([0], {})


def test_a_shrink_below_the_minimum_or_to_nothing_is_refused():
    assert elastic.shrink_refusal(3, 1, 2) is None
    assert "below --min-nproc 3" in str(elastic.shrink_refusal(3, 1, 3))
    assert "to 0 process(es)" in str(elastic.shrink_refusal(2, 2, 1))


def test_a_lost_host_orphans_the_slots_it_hosted_and_holders_follow_the_host():
    job = JobState(local_node="node0", hang_timeout=10.0)
    job.assignments = {0: "worker0", 2: "worker2"}
    job.hosted = {1: 0, 3: 2}
    assert elastic.orphans(job, [0]) == [0, 1]
    assert elastic.holder(job, 1) == "worker0" and elastic.holder(job, 2) == "worker2"
    assert elastic.holder(job, 5) is None


def started(tmp_path, nproc: int = 3, elastic: bool = True, **options) -> Driver:
    """``nproc`` workers of an --elastic --spares 0 job at step 10 of 100, 50 ms steps."""
    driver = Driver(tmp_path, nproc_per_node=nproc, spares=0, elastic=elastic, **options)
    for slot in range(nproc):
        driver.join(f"worker{slot}", slot=slot)
        driver.report(f"worker{slot}", "max_steps", max_steps=LONG)
        driver.report(f"worker{slot}", "progress", step=10, step_seconds=0.05)
    return driver


def shrink_after_kill(driver: Driver, slot: int, survivors: list[int], step: int = 10) -> None:
    driver.exit(f"worker{slot}", -9)
    driver.advance()
    for s in survivors:
        driver.report(f"worker{s}", "halted", committed=step)
    driver.advance()


def test_a_lost_slot_with_no_spare_is_hosted_by_a_survivor_and_nothing_is_lost(tmp_path):
    driver = started(tmp_path)
    shrink_after_kill(driver, 1, [0, 2])
    (shrunk,) = driver.events("job_shrunk")
    assert shrunk["slots"] == [1] and shrunk["hosts"] == {"1": 0} and shrunk["processes"] == 2
    assert shrunk["target_step"] == 10 and "rank 1" in shrunk["reason"]
    (plan,) = [m for m in driver.sent("worker2") if m["type"] == "plan"]
    assert plan["members"] == [(0, 0), (2, 2)]  # runs of slots
    assert plan["hosted"] == {"1": 0} and plan["receivers"] == []
    assert plan["sources"] == [(0, 0), (2, 2)]
    assert driver.job.hosted == {1: 0} and 1 not in driver.job.assignments
    driver.now += 1
    for s in (0, 2):
        driver.report(f"worker{s}", "progress", step=11, first_after_recovery=True, t=driver.now)
    driver.advance()
    (done,) = driver.events("recovery_done")
    assert done["lost_steps"] == 0 and done["recomputed_steps"] == 0
    assert not driver.events("recovery_abandoned") and driver.outcome() is None

    # The host dies too: its own slot and the one it hosted go to the last survivor.
    shrink_after_kill(driver, 0, [2], step=11)
    assert driver.events("job_shrunk")[-1]["hosts"] == {"0": 2, "1": 2}
    assert driver.job.assignments == {2: "worker2"}


def test_without_elastic_or_below_the_minimum_the_job_stops_as_before(tmp_path):
    plain = started(tmp_path / "plain", elastic=False)
    shrink_after_kill(plain, 1, [0, 2])
    assert not plain.events("job_shrunk") and plain.events("recovery_abandoned")
    assert "--min-nproc" not in plain.outcome()["reason"]

    floor = started(tmp_path / "floor", min_nproc=3)
    shrink_after_kill(floor, 1, [0, 2])
    assert not floor.events("job_shrunk")
    assert "below --min-nproc 3" in floor.outcome()["reason"]


def test_a_hosted_slot_regrows_onto_a_ready_spare_at_a_step_boundary(tmp_path):
    driver = started(tmp_path)
    shrink_after_kill(driver, 1, [0, 2])
    for s in (0, 2):
        driver.report(f"worker{s}", "progress", step=12, first_after_recovery=True, t=driver.now)
    driver.advance()
    driver.join("spare0", role="spare")
    ready = driver.report("spare0", "ready")
    assert any(type(a).__name__ == "StartRecovery" for a in ready)
    driver.advance()
    (asked,) = driver.events("handover_requested")
    assert asked["slots"] == [1] and asked["processes"] == ["worker0"]
    (start,) = driver.events("handover_start")
    boundary = start["boundary"]
    for s in (0, 2):
        driver.report(f"worker{s}", "halted", committed=boundary)
    driver.advance()
    (grown,) = driver.events("job_grown")
    assert grown["slots"] == [1] and grown["processes"] == {"1": "spare0"} and grown["hosts"] == {}
    plan = driver.sent("spare0")[-1]
    assert plan["slot"] == 1 and plan["receivers"] == [1] and "hosted" not in plan
    # The host keeps its own slot: nobody retires.
    assert driver.job.members["worker0"].state is MemberState.ACTIVE
    assert {"type": "retire"} not in driver.sent("worker0")
    assert driver.job.hosted == {} and driver.job.assignments[1] == "spare0"


def test_an_operator_release_retires_the_process_and_a_survivor_hosts_its_slot(tmp_path):
    driver = started(tmp_path)
    driver.take(elastic.release(driver.job, driver.config, 2, driver.now))
    driver.advance()
    (start,) = driver.events("handover_start")
    for s in range(3):
        driver.report(f"worker{s}", "halted", committed=start["boundary"])
    driver.advance()
    (shrunk,) = driver.events("job_shrunk")
    assert shrunk["hosts"] == {"2": 0} and "released" in shrunk["reason"]
    assert driver.sent("worker2")[-1] == {"type": "retire"}
    assert driver.job.members["worker2"].state is MemberState.RETIRED
    driver.now += 1
    for s in (0, 1):
        driver.report(f"worker{s}", "progress", step=28, first_after_recovery=True, t=driver.now)
    driver.advance()
    (done,) = driver.events("handover_done")
    assert done["retired"] == ["worker2"] and done["lost_steps"] == 0


def test_a_release_is_refused_without_elastic_below_the_minimum_or_when_busy(tmp_path):
    plain = started(tmp_path / "plain", elastic=False)
    with pytest.raises(ProtocolError, match="not started with --elastic"):
        elastic.release(plain.job, plain.config, 1, plain.now)
    floor = started(tmp_path / "floor", min_nproc=3)
    with pytest.raises(ProtocolError, match="below --min-nproc 3"):
        elastic.release(floor.job, floor.config, 1, floor.now)
    busy = started(tmp_path / "busy")
    busy.take(elastic.release(busy.job, busy.config, 1, busy.now))
    with pytest.raises(ProtocolError, match="under way"):
        elastic.release(busy.job, busy.config, 2, busy.now)
    with pytest.raises(ProtocolError, match="being released"):  # a drain waits for it too
        handover.request(busy.job, [2], "drain", busy.now, busy.now)
    with pytest.raises(ProtocolError, match="slot 7"):
        elastic.release(started(tmp_path / "x").job, busy.config, 7, busy.now)


def test_hosted_slots_round_trip_through_the_durable_state(tmp_path):
    driver = started(tmp_path)
    shrink_after_kill(driver, 1, [0, 2])
    again = JobState.from_dict(driver.job.to_dict())
    assert again.hosted == {1: 0} and again.recovery.current.shrink


def test_a_host_is_judged_per_micro_batch_not_taken_for_a_straggler(tmp_path):
    driver = started(tmp_path)
    shrink_after_kill(driver, 1, [0, 2])
    driver.report("worker0", "progress", step=11, compute_seconds=0.2)  # its own and rank 1's
    driver.report("worker2", "progress", step=11, compute_seconds=0.1)
    driver.take(liveness.tick(driver.job, driver.config, driver.now, driver.tails.get))
    assert not driver.events("straggler")
    driver.report("worker0", "progress", step=12, compute_seconds=0.5)
    driver.take(liveness.tick(driver.job, driver.config, driver.now, driver.tails.get))
    assert driver.events("straggler")[0]["slot"] == 0
