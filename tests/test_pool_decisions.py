"""The slot pool's decisions (issue 13), pure: attach, grant, borrow from the lowest priority,
never below a minimum or from a recovering or starving job, repay the oldest debt first."""

from __future__ import annotations

import pytest

from torchrelay.pool.decisions import (
    Borrow,
    Grant,
    NoSlot,
    PoolError,
    Repay,
    attach,
    detach,
    slot_freed,
    want_slot,
)
from torchrelay.pool.state import PoolState

STARVE = 600.0


def pool_of(idle: int = 0) -> PoolState:
    """High (priority 10, 2 slots) and two low jobs (1 and 2, 3 slots each, minimum 2)."""
    pool = PoolState.of_nodes({"node0": 4, "node1": 4 + idle})
    attach(pool, "high", 10, 2, 2)
    attach(pool, "low1", 1, 2, 3)
    attach(pool, "low2", 2, 2, 3)
    return pool


def test_jobs_attach_on_idle_slots_and_bad_requests_are_refused():
    pool = PoolState.of_nodes({"node0": 2, "node1": 1})
    assert attach(pool, "a", 1, 1, 2) == [Grant("node0/0", "a"), Grant("node0/1", "a")]
    with pytest.raises(PoolError, match="already attached"):
        attach(pool, "a", 1, 1, 1)
    with pytest.raises(PoolError, match="needs 2 slots but the pool has 1 idle"):
        attach(pool, "b", 1, 1, 2)
    with pytest.raises(PoolError, match=r"--min-nproc must be in \[1, 1\]"):
        attach(pool, "b", 1, 2, 1)


def test_an_idle_slot_is_a_spare_for_every_job():
    pool = pool_of(idle=1)
    assert want_slot(pool, "low1", 0.0, STARVE) == Grant("node1/4", "low1")
    assert not pool.loans


def test_a_job_borrows_from_the_lowest_priority_job_that_stays_above_its_minimum():
    pool = pool_of()
    first = want_slot(pool, "high", 0.0, STARVE)
    assert isinstance(first, Borrow) and first.lender == "low1" and first.borrower == "high"
    assert pool.holders[first.slot] == "high" and len(pool.held_by("low1")) == 2
    # low1 is at its minimum now: the next loan comes from low2.
    assert want_slot(pool, "high", 1.0, STARVE).lender == "low2"  # type: ignore[union-attr]
    # Nobody lends to a job of lower priority, nor below a minimum.
    assert isinstance(want_slot(pool, "low1", 2.0, STARVE), NoSlot)
    assert isinstance(want_slot(pool, "high", 2.0, STARVE), NoSlot)


def test_never_from_a_recovering_job_nor_one_starving_for_what_it_lent():
    pool = pool_of()
    pool.jobs["low1"].recovering = True
    assert want_slot(pool, "high", 0.0, STARVE).lender == "low2"  # type: ignore[union-attr]
    pool = pool_of()
    pool.jobs["low1"].min_nproc = 1
    assert want_slot(pool, "high", 0.0, STARVE).lender == "low1"  # type: ignore[union-attr]
    # low1 could lend again, but its first loan is older than the starvation limit.
    assert want_slot(pool, "high", STARVE + 1, STARVE).lender == "low2"  # type: ignore[union-attr]


def test_a_freed_slot_repays_the_oldest_debt_and_a_finished_job_frees_its_slots():
    pool = pool_of()
    lent = [want_slot(pool, "high", t, STARVE) for t in (0.0, 1.0)]
    assert [b.lender for b in lent] == ["low1", "low2"]  # type: ignore[union-attr]
    held = pool.held_by("high")
    # A debt is a slot, not the slot lent: high's first freed slots repay, oldest debt first.
    assert detach(pool, "high") == [Repay(held[0], "low1"), Repay(held[1], "low2")]
    assert len(pool.held_by("low1")) == len(pool.held_by("low2")) == 3 and len(pool.idle()) == 2
    assert not pool.loans and pool.jobs.keys() == {"low1", "low2"}
    assert slot_freed(pool, "node0/0") is None and "node0/0" in pool.idle()
    with pytest.raises(PoolError, match="no slot"):
        slot_freed(pool, "node9/0")


def test_the_pool_state_round_trips_through_json():
    pool = pool_of()
    want_slot(pool, "high", 3.0, STARVE)
    again = PoolState.from_dict(pool.to_dict())
    assert again == pool
