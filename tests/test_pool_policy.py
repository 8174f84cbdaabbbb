"""The pool's decisions (torchrelay.pool.policy), as pure functions over plain state."""

from __future__ import annotations

import json

import pytest

from torchrelay.pool import policy
from torchrelay.pool.policy import PoolRefusal, Rules
from torchrelay.pool.state import BROKEN, IDLE, IllegalLoanMove, LoanKind, LoanState, PoolState

RULES = Rules(max_lends=2, window=100.0)
SHRINK, PARK = LoanKind.SHRINK, LoanKind.PARK


def _pool(slots: int = 4) -> PoolState:
    return PoolState(slots=[IDLE] * slots)


def _two_jobs() -> PoolState:
    """H (priority 10, not elastic) on slots 2-3, L (priority 0, elastic, min 1) on 0-1."""
    state = _pool()
    assert policy.attach(state, "L", 2, 1, 0, True) == [0, 1]
    assert policy.attach(state, "H", 2, 2, 10, False) == [2, 3]
    return state


def _taken(state: PoolState, job: str) -> list[dict]:
    taken, state.jobs[job].commands = state.jobs[job].commands, []
    return taken


def _lose_one(state: PoolState, job: str, now: float = 0.0) -> None:
    processes = state.jobs[job].processes - 1
    policy.report(state, job, processes, True, 1, {}, now, RULES)


def test_attach_refuses_a_full_pool_a_duplicate_name_and_a_bad_minimum():
    state = _two_jobs()
    with pytest.raises(PoolRefusal, match="0 idle slot"):
        policy.attach(state, "M", 1, 1, 0, True)
    with pytest.raises(PoolRefusal, match="attached already"):
        policy.attach(state, "L", 1, 1, 0, True)
    with pytest.raises(PoolRefusal, match="min size 3"):
        policy.attach(_pool(), "M", 2, 3, 0, True)
    with pytest.raises(PoolRefusal, match="job name"):
        policy.attach(_pool(), "../x", 1, 1, 0, True)


def test_a_lost_process_takes_an_idle_slot_first():
    state = _pool(3)
    policy.attach(state, "H", 2, 2, 10, False)
    _lose_one(state, "H")
    assert state.slots == ["H", BROKEN, "H"]  # the slot it died on is set aside
    assert _taken(state, "H") == [{"type": "grant", "slot": 2}]
    assert state.jobs["H"].wanted == 0 and state.loans == []


def test_borrowing_asks_the_lender_to_release_and_moves_the_slot_once_it_did():
    state = _two_jobs()
    _lose_one(state, "H", now=1.0)
    assert _taken(state, "L") == [{"type": "release", "loan": 0, "borrower": "H"}]
    assert _taken(state, "H") == [] and state.loans[0].state is LoanState.ASKED
    # L still runs 2 processes: nothing moves yet.
    policy.report(state, "L", 2, True, 0, {}, 2.0, RULES)
    assert state.slots == ["L", "L", "H", BROKEN]
    policy.report(state, "L", 1, False, 0, {}, 3.0, RULES)  # the released process exited
    assert state.slots == ["L", "H", "H", BROKEN]
    assert _taken(state, "H") == [
        {"type": "grant", "slot": 1, "loan": 0, "lender": "L", "kind": "shrink"}
    ]
    assert state.loans[0].state is LoanState.ACTIVE and state.loans[0].slot == 1


def test_a_slot_that_comes_back_pays_the_loan_back_first():
    state = _two_jobs()
    _lose_one(state, "H")
    policy.report(state, "L", 1, False, 0, {}, 1.0, RULES)
    _taken(state, "H")
    policy.detach(state, "H", 2.0, RULES)
    assert state.slots == ["L", "L", IDLE, BROKEN]
    assert _taken(state, "L")[-1] == {"type": "grow", "slot": 1, "loan": 0}
    assert state.loans[0].state is LoanState.RETURNED


def test_a_refused_release_fails_the_loan_then_the_lender_is_asked_again_within_the_limit():
    state = _two_jobs()
    _lose_one(state, "H")
    _taken(state, "L")
    policy.report(state, "L", 2, False, 0, {0: "a handover is under way"}, 1.0, RULES)
    assert state.loans[0].state is LoanState.FAILED
    assert "refused: a handover" in state.loans[0].note
    # Asked once in the window, max_lends 2: L is asked once more.
    assert _taken(state, "L") == [{"type": "release", "loan": 1, "borrower": "H"}]
    policy.report(state, "L", 2, False, 0, {1: "a handover is under way"}, 2.0, RULES)
    (refuse,) = _taken(state, "H")
    assert refuse["type"] == "refuse" and "L: lent 2 time(s) in the last 100 s" in refuse["reason"]
    assert state.jobs["H"].wanted == 0


def test_choose_lender_follows_priority_minimum_recovery_and_the_lend_limit():
    state = _pool(8)
    policy.attach(state, "H", 2, 2, 10, False)
    policy.attach(state, "low", 2, 1, 0, True)
    policy.attach(state, "mid", 2, 1, 5, True)
    policy.attach(state, "top", 2, 1, 20, True)  # higher than H: never a lender
    h = state.jobs["H"]
    assert policy.choose_lender(state, h, 0.0, RULES) == ("low", SHRINK, "")
    state.jobs["low"].recovering = True  # never borrow from a job mid-recovery
    assert policy.choose_lender(state, h, 0.0, RULES) == ("mid", SHRINK, "")
    state.jobs["mid"].lent_at = [10.0, 20.0]  # lent twice in the window: skipped
    lender, _, why = policy.choose_lender(state, h, 50.0, RULES)
    assert lender is None
    assert "low: recovering" in why and "mid: lent 2 time(s)" in why and "top: priority" in why
    assert policy.choose_lender(state, h, 200.0, RULES) == ("mid", SHRINK, "")  # the window passed
    state.jobs["mid"].processes = 1  # at its minimum
    assert policy.choose_lender(state, h, 200.0, RULES)[0] is None


def test_no_lender_refuses_the_borrower_and_a_job_that_cannot_shrink_never_lends():
    state = _pool(4)
    policy.attach(state, "H", 2, 2, 10, False)
    policy.attach(state, "rigid", 2, 2, 0, False)
    _lose_one(state, "H")
    (refuse,) = _taken(state, "H")
    assert refuse["type"] == "refuse" and "rigid: cannot shrink: not --elastic" in refuse["reason"]
    assert "cannot park: does not park" in refuse["reason"]
    assert state.jobs["H"].wanted == 0 and state.loans == []


def test_a_lenders_pending_releases_count_against_its_minimum():
    state = _two_jobs()
    _lose_one(state, "H")
    assert state.loans[0].lender == "L"
    # A second loss of H: L has one release pending and would go below its minimum.
    policy.report(state, "H", 0, True, 1, {}, 1.0, RULES)
    (refuse,) = _taken(state, "H")
    assert refuse["type"] == "refuse" and "L: cannot shrink: at its minimum" in refuse["reason"]


def test_a_growing_lender_is_not_asked():
    state = _two_jobs()
    state.jobs["L"].processes = 1  # a loan came back: its spare is still starting
    _lose_one(state, "H")
    (refuse,) = _taken(state, "H")
    assert "L: growing or shrinking" in refuse["reason"]


def test_state_round_trips_and_loans_move_only_as_documented():
    state = _two_jobs()
    _lose_one(state, "H")
    again = PoolState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state
    with pytest.raises(IllegalLoanMove):
        again.loans[0].move(LoanState.RETURNED)
