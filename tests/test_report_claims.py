"""Reports are fenced and their step claims checked against the plan, over real gRPC: a dead
member cannot report (not even an error), and no claim beyond the job's steps is recorded."""

from __future__ import annotations

import pytest

from tests.test_control_plane import job  # noqa: F401  (the controller behind a real server)
from torchrelay.control.claims import claimed_step, judge_claim, judge_max_steps
from torchrelay.control.client import ControlError
from torchrelay.control.protocol import Halted, PhaseDone, Progress
from torchrelay.ledger import read_ledger


def _refused(run_dir) -> list[dict]:
    return [e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "claim_refused"]


def test_a_dead_member_cannot_report_even_an_error(job):  # noqa: F811
    controller, _, client, _, _ = job
    w0, w1 = client("worker0"), client("worker1")
    for slot, worker in enumerate((w0, w1)):
        worker.join("worker", 10 + slot, "node0", slot)
        worker.report("max_steps", max_steps=10)
        worker.report("progress", generation=0, step=2)
    controller.on_exit("worker1", -9)  # seen dead, and nobody has fenced it yet
    for kind, body in [
        ("error", {"step": 3, "traceback": "forged"}),
        ("progress", {"generation": 0, "step": 9}),
        ("done", {"generation": 0, "step": 9}),
    ]:
        with pytest.raises(ControlError) as err:
            w1.report(kind, **body)
        assert err.value.code == "FAILED_PRECONDITION"
    assert controller.members["worker1"].error is None
    assert controller.status()["steps_committed"] == 3
    controller.stop("test over")


def test_claims_beyond_the_plan_are_refused_and_recorded(job):  # noqa: F811
    controller, _, client, run_dir, _ = job
    w0, w1 = client("worker0"), client("worker1")
    w0.join("worker", 10, "node0", 0)
    w1.join("worker", 11, "node0", 1)
    with pytest.raises(ControlError, match="before any rank declared max_steps"):
        w0.report("progress", generation=0, step=0)
    w0.report("max_steps", max_steps=10)
    with pytest.raises(ControlError, match="every rank must pass the same max_steps"):
        w1.report("max_steps", max_steps=20)
    w1.report("max_steps", max_steps=10)
    w0.report("progress", generation=0, step=5)
    for kind, body, message in [
        ("progress", {"step": 10**9}, "beyond the job's last step 9"),
        ("progress", {"step": 3}, "went backwards"),
        ("progress", {"step": "5"}, "not a step number"),
        ("done", {"step": 6}, "last step is 9"),
        ("halted", {"committed": 10, "in_flight": None}, "beyond the job's last step"),
    ]:
        with pytest.raises(ControlError) as err:
            w0.report(kind, generation=0, **body)
        assert err.value.code == "INVALID_ARGUMENT" and message in err.value.message
    assert controller.status()["steps_committed"] == 6
    # The claim of step "5" is malformed, refused as the server decodes it: no claim to record.
    assert len(_refused(run_dir)) == 6
    assert {e["process"] for e in _refused(run_dir)} == {"worker0", "worker1"}
    # The channels are in order each on its own: a heartbeat may trail the training thread.
    w0.report("progress", generation=0, step=9, first_after_recovery=True)
    w0.report("progress", generation=0, step=6)
    w0.report("done", generation=0, step=9)
    assert controller.status()["steps_committed"] == 10


def test_claim_rules():
    assert claimed_step(Progress(step=4)) == ("beat", 4)
    assert claimed_step(Progress(step=4, first_after_recovery=True)) == ("main", 4)
    assert claimed_step(Halted(committed=3)) == ("main", 3)
    assert claimed_step(PhaseDone(phase="comm_ready")) is None
    assert judge_claim("progress", -1, None, None) is None
    assert judge_claim("progress", 0, None, None) is not None
    assert judge_claim("progress", 9, 10, 9) is None
    assert judge_claim("progress", 10, 10, None) is not None
    assert judge_claim("progress", True, 10, None) is not None
    assert judge_claim("progress", -2, 10, None) is not None
    assert judge_claim("progress", 4, 10, 5) is not None
    assert judge_claim("progress", 4, 10, None) is None  # a receiver, back to its target
    assert judge_claim("done", 9, 10, 9) is None
    assert judge_claim("done", -1, 0, None) is None
    assert judge_max_steps(10, None) is None and judge_max_steps(10, 10) is None
    assert judge_max_steps(11, 10) is not None and judge_max_steps(-1, None) is not None
    assert judge_max_steps(1.5, None) is not None
