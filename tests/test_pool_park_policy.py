"""Parking in the pool's policy (torchrelay.pool.policy): a lender at its minimum parks whole."""

from __future__ import annotations

import json

from torchrelay.pool import policy
from torchrelay.pool.policy import Rules
from torchrelay.pool.state import BROKEN, IDLE, LoanKind, LoanState, PoolState

RULES = Rules(max_lends=2, window=100.0)


def _park_pair() -> PoolState:
    """L (priority 0, 2 processes, min 2, parkable) on slots 0-1, H (priority 10) on slot 2."""
    state = PoolState(slots=[IDLE] * 3)
    assert policy.attach(state, "L", 2, 2, 0, False, parkable=True) == [0, 1]
    assert policy.attach(state, "H", 1, 1, 10, False) == [2]
    return state


def _taken(state: PoolState, job: str) -> list[dict]:
    taken, state.jobs[job].commands = state.jobs[job].commands, []
    return taken


def test_a_lender_at_its_minimum_parks_whole_and_is_paid_back_all_at_once():
    state = _park_pair()
    policy.report(state, "H", 0, True, 1, {}, 1.0, RULES)
    assert _taken(state, "L") == [{"type": "park", "loan": 0, "borrower": "H"}]
    assert state.loans[0].kind is LoanKind.PARK and state.loans[0].state is LoanState.ASKED
    policy.report(state, "L", 2, False, 0, {}, 2.0, RULES)  # not halted yet: nothing moves
    assert state.slots == ["L", "L", BROKEN] and _taken(state, "H") == []
    policy.report(state, "L", 2, False, 0, {}, 3.0, RULES, parked=True)
    assert state.slots == [IDLE, "H", BROKEN]  # one slot to H, the other to the pool
    assert _taken(state, "H") == [
        {"type": "grant", "slot": 1, "loan": 0, "lender": "L", "kind": "park"}
    ]
    loan = state.loans[0]
    assert loan.state is LoanState.ACTIVE and (loan.slot, loan.count) == (1, 2)
    again = PoolState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state and again.loans[0].kind is LoanKind.PARK
    policy.report(state, "L", 2, False, 0, {}, 4.0, RULES, parked=True)  # one idle: not enough
    assert _taken(state, "L") == []
    policy.detach(state, "H", 5.0, RULES)
    assert _taken(state, "L") == [{"type": "unpark", "loan": 0, "slots": [0, 1]}]
    assert state.slots == ["L", "L", BROKEN] and loan.state is LoanState.RETURNED


def test_a_shrink_is_preferred_to_a_park_even_from_a_higher_priority_job():
    state = PoolState(slots=[IDLE] * 5)
    policy.attach(state, "rigid", 2, 2, 0, False, parkable=True)
    policy.attach(state, "elastic", 2, 1, 5, True, parkable=True)
    policy.attach(state, "H", 1, 1, 10, False)
    h = state.jobs["H"]
    assert policy.choose_lender(state, h, 0.0, RULES) == ("elastic", LoanKind.SHRINK, "")
    state.jobs["elastic"].processes = state.jobs["elastic"].min_nproc = 1
    state.slots[state.held("elastic")[-1]] = IDLE
    # Neither can shrink now: the lowest-priority parkable job parks.
    assert policy.choose_lender(state, h, 0.0, RULES) == ("rigid", LoanKind.PARK, "")


def test_no_park_mid_recovery_when_opted_out_past_the_lend_limit_or_while_parked():
    state = _park_pair()
    h, lender = state.jobs["H"], state.jobs["L"]
    lender.recovering = True
    assert policy.choose_lender(state, h, 0.0, RULES)[2] == "L: recovering"
    lender.recovering, lender.parkable = False, False
    why = policy.choose_lender(state, h, 0.0, RULES)[2]
    assert why == "L: cannot shrink: not --elastic, cannot park: does not park " + (
        "(--no-park, or its launcher cannot)"
    )
    lender.parkable, lender.lent_at = True, [1.0, 2.0]
    assert "L: lent 2 time(s)" in policy.choose_lender(state, h, 50.0, RULES)[2]
    assert policy.choose_lender(state, h, 150.0, RULES)[:2] == ("L", LoanKind.PARK)
    lender.parked = True
    assert policy.choose_lender(state, h, 150.0, RULES)[2] == "L: parked"


def test_a_refused_park_fails_the_loan_and_a_parked_lenders_shrink_loans_wait_for_it():
    state = _park_pair()
    policy.report(state, "H", 0, True, 1, {}, 1.0, RULES)
    _taken(state, "L")
    policy.report(state, "L", 2, True, 0, {0: "a recovery is under way"}, 2.0, RULES)
    assert state.loans[0].state is LoanState.FAILED
    (refuse,) = _taken(state, "H")  # L is recovering now: no lender
    assert refuse["type"] == "refuse" and "L: recovering" in refuse["reason"]
    # A parked lender with an older shrink loan: neither is paid back before the park loan.
    state = PoolState(slots=[IDLE] * 4)
    policy.attach(state, "L", 3, 2, 0, True, parkable=True)
    policy.attach(state, "H", 1, 1, 10, False)
    policy.report(state, "H", 0, True, 1, {}, 1.0, RULES)
    assert _taken(state, "L")[0]["type"] == "release"
    policy.report(state, "L", 2, False, 0, {}, 2.0, RULES)  # shrunk: slot 2 lent
    policy.report(state, "H", 0, True, 1, {}, 3.0, RULES)  # H loses its borrowed process too
    assert _taken(state, "L") == [{"type": "park", "loan": 1, "borrower": "H"}]
    policy.report(state, "L", 2, False, 0, {}, 4.0, RULES, parked=True)
    assert state.slots == [IDLE, "H", BROKEN, BROKEN]
    policy.detach(state, "H", 5.0, RULES)  # 2 idle slots: the park loan (count 2) first
    assert _taken(state, "L") == [{"type": "unpark", "loan": 1, "slots": [0, 1]}]
    assert state.loans[0].state is LoanState.ACTIVE  # no idle slot left for the shrink loan
