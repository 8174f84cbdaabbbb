"""A job's side of a pool (torchrelay.control.pool_side, spares with --pool), driven by hand:
a recovery asks the pool and waits for it, a grant starts a spare, a refusal ends the wait, a
release goes through the elastic release, a returned loan starts a spare."""

from __future__ import annotations

from tests.fsm import Driver
from torchrelay.config import PoolSpec
from torchrelay.control import pool_side
from torchrelay.control.actions import AskPool, StartLocalSpare
from torchrelay.control.state import JobState

POOL = PoolSpec("127.0.0.1:1", "t" * 32, "H", 10)


def _lose_worker1(driver: Driver) -> None:
    driver.start(steps=3, spare=False)
    driver.exit("worker1", -9)
    driver.advance()
    driver.report("worker0", "halted", committed=3)
    driver.advance()


def _command(driver: Driver, command: dict, advance: bool = True) -> str | None:
    actions, refused = pool_side.apply(driver.job, driver.config, command, driver.now)
    driver.take(actions)
    if advance:
        driver.advance()
    return refused


def test_a_recovery_asks_the_pool_once_and_waits_then_a_grant_replaces_the_slot(tmp_path):
    driver = Driver(tmp_path, spares=0, pool=POOL)
    _lose_worker1(driver)
    assert [a for a in driver.actions if isinstance(a, AskPool)] == [AskPool(1)]
    assert driver.events("pool_asked") == [{"slots": 1, "pool": POOL.address}]
    assert driver.job.pool_asked == 1 and not driver.events("recovery_abandoned")
    assert pool_side.view(driver.job) == (1, True, False)

    _command(driver, {"type": "grant", "slot": 1, "loan": 0, "lender": "L"})
    assert driver.events("pool_granted") == [{"slot": 1, "lender": "L", "loan": 0}]
    _last_spare(driver)
    assert driver.job.pool_asked == 0 and driver.job.spares_launching["node0"] == 1
    driver.join("spare0", role="spare")
    driver.report("spare0", "ready")
    driver.advance()
    assert driver.events("recovery_planned") and driver.job.assignments[1] == "spare0"


def _last_spare(driver: Driver) -> StartLocalSpare:
    (spare,) = [a for a in driver.actions if isinstance(a, StartLocalSpare)]
    return spare


def test_a_refusal_ends_the_wait_as_without_a_pool(tmp_path):
    driver = Driver(tmp_path, spares=0, pool=POOL)
    _lose_worker1(driver)
    _command(driver, {"type": "refuse", "reason": "no idle slot and no lender (L: recovering)"})
    assert driver.events("pool_refused")[0]["reason"].endswith("(L: recovering)")
    (abandoned,) = driver.events("recovery_abandoned")
    assert abandoned["slots"] == [1] and driver.outcome()["status"] == "failed"


def test_a_release_is_the_elastic_release_of_the_highest_slot_and_a_refusal_says_why(tmp_path):
    driver = Driver(tmp_path, spares=0, elastic=True, pool=POOL)
    driver.start(steps=3, spare=False)
    assert _command(driver, {"type": "release", "loan": 4, "borrower": "H"}, False) is None
    assert driver.events("pool_lend") == [{"loan": 4, "borrower": "H", "slot": 1, "kind": "shrink"}]
    (asked,) = driver.events("handover_requested")
    assert asked["slots"] == [1] and pool_side.view(driver.job) == (2, True, False)
    why = _command(driver, {"type": "release", "loan": 5, "borrower": "H"}, False)
    assert why is not None and "under way" in why
    assert driver.events("pool_lend")[-1] == {
        "loan": 5,
        "borrower": "H",
        "refused": why,
        "kind": "shrink",
    }

    rigid = Driver(tmp_path / "rigid", spares=0, pool=POOL)
    rigid.start(steps=3, spare=False)
    why = _command(rigid, {"type": "release", "loan": 0, "borrower": "H"}, False)
    assert why is not None and "not started with --elastic" in why


def test_a_returned_loan_starts_a_spare_and_the_state_keeps_what_was_asked(tmp_path):
    driver = Driver(tmp_path, spares=0, elastic=True, pool=POOL)
    driver.start(steps=3, spare=False)
    _command(driver, {"type": "grow", "slot": 1, "loan": 0})
    assert driver.events("pool_returned") == [{"loan": 0, "slot": 1}]
    _last_spare(driver)
    driver.job.pool_asked = 2
    assert JobState.from_dict(driver.job.to_dict()).pool_asked == 2
