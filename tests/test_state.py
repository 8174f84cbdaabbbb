"""The controller's plain state: the member state machine and the JSON round trip."""

from __future__ import annotations

import json

import pytest

from tests.fsm import Driver
from torchrelay.control.errors import IllegalTransition, ProtocolError
from torchrelay.control.state import (
    TRANSITIONS,
    JobState,
    Member,
    MemberState,
    RecoveryStep,
    Role,
    move,
)


def member(state: MemberState) -> Member:
    return Member("worker0", Role.WORKER, "node0", 1, last_seen=0.0, state=state)


def test_every_state_has_its_transitions_and_fenced_is_final():
    assert set(TRANSITIONS) == set(MemberState)
    assert TRANSITIONS[MemberState.FENCED] == frozenset()
    assert TRANSITIONS[MemberState.DEAD] == {MemberState.FENCED}


def test_an_illegal_transition_is_refused_and_leaves_the_member_as_it_was():
    dead = member(MemberState.DEAD)
    with pytest.raises(IllegalTransition, match="worker0 cannot go from dead to active"):
        move(dead, MemberState.ACTIVE)
    assert dead.state is MemberState.DEAD
    assert issubclass(IllegalTransition, ProtocolError)  # a client gets INVALID_ARGUMENT
    ready = member(MemberState.READY)
    with pytest.raises(IllegalTransition):
        move(ready, MemberState.HALTED)  # a spare holds no step to halt


def test_the_protocol_paths_are_legal():
    path = [MemberState.READY, MemberState.ACTIVE, MemberState.HALTED, MemberState.ACTIVE]
    path += [MemberState.DONE, MemberState.HALTED, MemberState.HALTED, MemberState.FENCING]
    path += [MemberState.DEAD, MemberState.FENCED]
    spare = member(MemberState.STARTING)
    for state in path:
        move(spare, state)
    assert spare.state is MemberState.FENCED


def test_a_job_in_the_middle_of_a_recovery_round_trips_through_json(tmp_path):
    driver = Driver(tmp_path)
    driver.start(steps=2)
    driver.report("worker0", "progress", step=3, step_seconds=0.1, compute_seconds=0.05)
    driver.report("worker1", "error", step=4, traceback="boom")
    driver.exit("worker1", -9)
    driver.advance()
    driver.report("worker0", "halted", committed=3, in_flight=4, last_commit_t=999.0)
    driver.advance()  # the plan is out: generation 1, waiting for its first step
    driver.report("worker0", "phase", phase="comm_ready", t=1000.5)
    job = driver.job
    current = job.recovery.current
    assert current is not None and current.step is RecoveryStep.DONE and current.plan
    assert job.generation == 1 and job.assignments == {0: "worker0", 1: "spare0"}

    text = json.dumps(job.to_dict())
    restored = JobState.from_dict(json.loads(text))
    assert restored == job
    assert restored.to_dict() == job.to_dict()
    assert restored.recovery.current.phases == {"comm_ready": {0: {"t": 1000.5}}}
    assert restored.members["spare0"].role is Role.SPARE
    assert restored.members["worker1"].state is MemberState.DEAD
