"""Parking (torchrelay.control.parking), as pure transitions: a pool's ``park`` halts every
rank at one boundary and holds there, heartbeating, until ``unpark`` re-forms the same members."""

from __future__ import annotations

import dataclasses

import pytest

from tests.fsm import Driver
from torchrelay.config import PoolSpec
from torchrelay.control import liveness, pool_side
from torchrelay.control.errors import ProtocolError
from torchrelay.control.job_view import describe_job

L = PoolSpec("127.0.0.1:1", "t" * 32, "L", 0)
LONG = 100


def _parked(tmp_path) -> Driver:
    """Two workers of a 100-step job at step 10 (50 ms steps), parked at step 27."""
    driver = Driver(tmp_path, spares=0, pool=L)
    for slot in (0, 1):
        driver.join(f"worker{slot}", slot=slot)
        driver.report(f"worker{slot}", "max_steps", max_steps=LONG)
        driver.report(f"worker{slot}", "progress", step=10, step_seconds=0.05)
    actions, refused = pool_side.apply(
        driver.job, driver.config, {"type": "park", "loan": 3, "borrower": "H"}, driver.now
    )
    driver.take(actions)
    assert refused is None
    assert driver.events("pool_lend") == [{"loan": 3, "borrower": "H", "kind": "park"}]
    driver.advance()
    told = {"type": "handover", "generation": 0, "step": 27}
    assert driver.sent("worker0") == [told] and driver.sent("worker1") == [told]
    assert pool_side.view(driver.job) == (2, True, False)  # not halted yet: slots stay
    driver.now += 1
    for process in ("worker0", "worker1"):
        driver.report(process, "halted", committed=27)
    assert driver.advance() is None  # no deadline: the pool's unpark wakes it
    return driver


def test_a_parked_job_holds_at_the_boundary_and_is_not_taken_for_hung(tmp_path):
    driver = _parked(tmp_path)
    (parked,) = driver.events("job_parked")
    assert parked == {"loan": 3, "borrower": "H", "step": 27, "processes": ["worker0", "worker1"]}
    assert not driver.events("recovery_planned")
    assert pool_side.view(driver.job) == (2, False, True)
    status = describe_job(driver.job, driver.config, {}, driver.now)
    assert status["parked"] and not status["recovering"]
    for _ in range(20):  # parked far past any hang timeout, heartbeating
        driver.now += 30
        for process in ("worker0", "worker1"):
            driver.report(process, "progress", step=27)
        driver.take(liveness.tick(driver.job, driver.config, driver.now, driver.tails.get))
        assert driver.advance() is None
    assert not driver.events("hang_detected") and not driver.events("recovery_planned")


def test_unpark_re_forms_the_same_members_from_the_boundary_losing_nothing(tmp_path):
    driver = _parked(tmp_path)
    driver.now += 5
    command = {"type": "unpark", "loan": 3, "slots": [0, 1]}
    actions, _ = pool_side.apply(driver.job, driver.config, command, driver.now)
    driver.take(actions)
    (unparked,) = driver.events("job_unparked")
    assert unparked == {"loan": 3, "slots": [0, 1], "step": 27, "parked_seconds": 5.0}
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["target_step"] == 27 and planned["replaced"] == {}
    assert planned["receivers"] == []
    assert not any(m == {"type": "retire"} for p in ("worker0", "worker1") for m in driver.sent(p))
    driver.now += 1
    for process in ("worker0", "worker1"):
        driver.report(process, "progress", step=28, first_after_recovery=True, t=driver.now)
    driver.advance()
    (done,) = driver.events("handover_done")
    assert done["recomputed_steps"] == 0 and done["lost_steps"] == 0 and done["retired"] == []
    assert driver.job.recovery.current is None and pool_side.view(driver.job) == (2, False, False)


def test_park_is_refused_mid_recovery_when_opted_out_and_unpark_only_when_parked(tmp_path):
    driver = _parked(tmp_path / "a")
    again = {"type": "park", "loan": 4, "borrower": "H"}
    why = pool_side.apply(driver.job, driver.config, again, driver.now)[1]
    assert why == "a recovery or handover is under way: park after it"
    rigid = Driver(tmp_path / "b", spares=0, pool=dataclasses.replace(L, parkable=False))
    rigid.start(steps=3, spare=False)
    why = pool_side.apply(rigid.job, rigid.config, again, rigid.now)[1]
    assert why == "the job was started with --no-park"
    free = Driver(tmp_path / "c", spares=0, pool=L)
    free.start(steps=3, spare=False)
    with pytest.raises(ProtocolError, match="the job is not parked"):
        pool_side.apply(free.job, free.config, {"type": "unpark", "loan": 0, "slots": []}, 1.0)
