"""Recovery decisions: who replaces whom, which step, who sends and who receives."""

import pytest

from torchrelay.control.planner import PlanningError, Spare, choose_replacements, plan_recovery


def test_target_is_highest_committed_and_laggards_receive():
    plan = plan_recovery(
        generation=3,
        assignments={0: "w0", 1: "w1", 2: "w2", 3: "w3"},
        replacements={2: Spare("s0", "node0")},
        committed={0: 41, 1: 42, 3: 42},
        highest_committed=42,
    )
    assert plan.generation == 4
    assert plan.target_step == 42
    assert plan.sources == (1, 3)
    assert plan.receivers == (0, 2)
    assert plan.assignments == {0: "w0", 1: "w1", 2: "s0", 3: "w3"}
    assert plan.lost_steps == 0


def test_before_any_commit_the_lowest_survivor_is_the_only_source():
    # The set-up's state: DDP's first broadcast would have made it rank 0's everywhere.
    plan = plan_recovery(
        0, {0: "a", 1: "b", 2: "c"}, {0: Spare("s", "n")}, {1: -1, 2: -1}, highest_committed=-1
    )
    assert plan.target_step == -1
    assert plan.sources == (1,) and plan.receivers == (0, 2)


def test_dead_rank_ahead_of_survivors_shows_as_lost_steps():
    plan = plan_recovery(0, {0: "a", 1: "b"}, {1: Spare("s", "n")}, {0: 10}, highest_committed=11)
    assert plan.target_step == 10
    assert plan.lost_steps == 1


def test_no_survivor_is_a_planning_error():
    with pytest.raises(PlanningError, match="no live replica"):
        plan_recovery(0, {0: "a"}, {0: Spare("s", "n")}, {}, highest_committed=5)


def test_replacement_prefers_another_node():
    spares = [Spare("same", "node1"), Spare("other", "node2")]
    chosen = choose_replacements({3: "node1"}, spares, {3: "node1"})
    assert chosen[3].process == "other"


def test_replacement_falls_back_to_same_node_and_first_ready():
    spares = [Spare("first", "node1"), Spare("second", "node1")]
    assert choose_replacements({0: "node1"}, spares, {})[0].process == "first"


def test_each_failed_slot_gets_its_own_spare():
    spares = [Spare("a", "n2"), Spare("b", "n3")]
    chosen = choose_replacements({0: "n1", 1: "n1"}, spares, {})
    assert {chosen[0].process, chosen[1].process} == {"a", "b"}


def test_too_few_spares_is_a_planning_error():
    with pytest.raises(PlanningError, match="only 1 spare"):
        choose_replacements({0: "n", 1: "n"}, [Spare("a", "m")], {})
