"""Parsing --chaos specs, with clear errors for bad ones."""

import itertools

import pytest

from torchrelay.chaos import ChaosSpecError, parse_chaos, parse_schedule, random_schedule


def test_kill_spec_with_phase():
    event = parse_chaos("kill:rank=2:step=10:phase=backward", 0)
    assert (event.action, event.rank, event.step, event.phase) == ("kill", 2, 10, "backward")


def test_default_phase_is_forward():
    assert parse_chaos("kill:rank=0:step=1", 3).phase == "forward"


@pytest.mark.parametrize(
    "spec,message",
    [
        ("explode:rank=1:step=1", "unknown action"),
        ("kill:rank=1", "required"),
        ("kill:rank=x:step=1", "integers"),
        ("kill:rank=1:step=1:phase=sideways", "phase"),
        ("kill:rank=1:step=1:when=now", "bad field"),
        ("drop:rank=1:step=1:phase=backward", "no phase"),
    ],
)
def test_bad_specs_explain_themselves(spec, message):
    with pytest.raises(ChaosSpecError, match=message):
        parse_chaos(spec, 0)


def test_rank_outside_world_is_refused():
    with pytest.raises(ChaosSpecError, match="outside the job"):
        parse_schedule(["kill:rank=4:step=1"], world_size=4)


def test_random_schedule_is_reproducible_and_mixed():
    mix = {"hangs": 4, "during_recovery": 3, "stalls": 2, "drops": 1}
    specs = random_schedule(3, failures=30, world_size=3, first_step=2, last_step=120, **mix)
    assert specs == random_schedule(3, 30, 3, 2, 120, **mix)
    assert len(specs) == 30
    events = parse_schedule(specs, world_size=3)
    assert sum(e.action == "hang" for e in events) == 4
    assert sum(e.action == "stall" for e in events) == 2
    assert sum(e.action == "drop" for e in events) == 1
    assert sum(e.phase == "transfer" for e in events) == 3
    primary = [e.step for e in events if e.phase != "transfer"]
    assert all(b - a >= 2 for a, b in itertools.pairwise(primary))


def test_random_schedule_refuses_impossible_requests():
    with pytest.raises(ValueError, match="do not fit"):
        random_schedule(0, failures=10, world_size=2, first_step=0, last_step=5)


def test_slow_needs_seconds():
    assert parse_chaos("slow:rank=1:step=3:seconds=0.2", 0).seconds == 0.2
    with pytest.raises(ChaosSpecError, match="seconds"):
        parse_chaos("slow:rank=1:step=3", 0)


def test_node_faults_name_a_node_not_a_rank():
    cut = parse_chaos("partition:node=1:step=40:seconds=20", 0)
    assert (cut.action, cut.node, cut.step, cut.seconds, cut.rank) == ("partition", 1, 40, 20, -1)
    assert parse_chaos("kill-node:node=2:step=5", 1).node == 2
    with pytest.raises(ChaosSpecError, match="takes node="):
        parse_chaos("kill-node:rank=1:step=5", 0)
    with pytest.raises(ChaosSpecError, match="seconds"):
        parse_chaos("partition:node=1:step=5", 0)
    with pytest.raises(ChaosSpecError, match="node 0 hosts the controller"):
        parse_schedule(["kill-node:node=0:step=5"], world_size=4, nnodes=2)
    with pytest.raises(ChaosSpecError, match="has 2 node"):
        parse_schedule(["kill-node:node=2:step=5"], world_size=4, nnodes=2)
