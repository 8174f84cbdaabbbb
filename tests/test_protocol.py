"""The typed protocol and ledger events: every message and event round-trips through JSON as
it is on the wire / in the ledger, malformed ones are refused with one line, and a real job's
ledger reads entirely into typed events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import run_job
from torchrelay import events as ev
from torchrelay.control import protocol as p
from torchrelay.events_criu import CopyFailed, ReplicaCloned
from torchrelay.ledger import LedgerError, read_ledger

REPORTS = [
    p.MaxSteps(generation=0, max_steps=10),
    p.Progress(generation=1, step=4, step_age=0.2, waiting=None, busy="allreduce"),
    p.Progress(generation=1, step=-1, step_seconds=0.1, compute_seconds=0.05),
    p.Progress(generation=2, step=7, first_after_recovery=True, t=1000.5),
    p.Ready(generation=-1),
    p.Halted(generation=0, committed=3, in_flight=4, last_commit_t=999.0),
    p.Halted(generation=1, committed=-1, valid=False, reason="transfer failed"),
    p.PhaseDone(generation=1, phase="transfer_done", t=1.5, bytes=4096, seconds=0.25),
    p.ToldLate(generation=0, step=27),
    p.Done(generation=0, step=9),
    p.ErrorReport(step=None, traceback="Traceback ...\nValueError: bad shape"),
    p.ChaosFired(generation=0, id=2),
    p.WarningReport(generation=0, step=5, message="differs", what="x", objects=("model",)),
]
NODE_REPORTS = [
    p.NodeHeartbeat(),
    p.NodeExit(exited="worker3", returncode=-9),
    p.ChaosNotice(fault="partition", ok=True, interfaces=("eth0",), seconds=5.0),
    p.ChaosNotice(fault="partition", ok=False, error="no nft"),
    p.HealthReport(readings=({"node": "node1", "device": 0, "source": "nvml", "t": 5.0},)),
    p.CopyOutcome(
        event=CopyFailed(process="worker1", kind="migrate", reason="no", t=2.0).to_json()
    ),
]
PLAN = {
    "type": "plan",
    "generation": 1,
    "target_step": 3,
    "sources": [[0, 0]],
    "receivers": [1],
    "members": [[0, 1]],
    "slot": 1,
}
MESSAGES = [
    p.Abort(generation=3),
    p.Plan(
        generation=4,
        target_step=8,
        sources=((0, 0), (2, 2)),
        receivers=(1,),
        members=((0, 2),),
        slot=1,
        chaos=({"id": 1, "action": "kill", "rank": 1, "step": 9},),
    ),
    p.Plan(
        generation=5,
        target_step=8,
        sources=((0, 0),),
        receivers=(1,),
        members=((0, 1),),
        slot=0,
        store="10.0.0.2:29500",
    ),
    p.Plan(
        generation=6,
        target_step=8,
        sources=((0, 0), (2, 2)),
        receivers=(),
        members=((0, 0), (2, 2)),
        slot=0,
        hosted={"1": 0},
    ),
    p.Handover(generation=4, step=27),
    p.Retire(),
    p.Park(generation=2),
    p.Finish(),
]
COMMANDS = [
    p.StartSpare(),
    p.StartSpare(avoid=(1, 3)),
    p.Signal(process="worker1", signal=9),
    p.Chaos(fault="kill-node", seconds=0.0),
    p.CopyProcess(kind="clone", process="worker1", slot=0, generation=2, ordered=1000.5),
    p.CopyProcess(kind="migrate", process="node1-spare0", slot=1, generation=3, ordered=9.0),
    p.Seated(process="node1-spare0", slot=3),
    p.FinishNode(),
    p.FinishNode(joined=("node1-spare0", "worker3")),
]
OTHERS = [
    p.JoinRequest(role="worker", pid=123, node="node0", slot=2),
    p.JoinRequest(role="spare", pid=124, node="node1", slot=None),
    p.JoinAnswer(
        world_size=4, generation=0, chaos=(), collective_timeout=300.0, rendezvous_timeout=30.0
    ),
    p.Lease(hang_timeout=12.5),
    p.NodeJoin(node="node1"),
    p.NodeJoinAnswer(world_size=4, node_timeout=30.0),
]
FAMILIES = [
    (REPORTS, p.REPORTS, p.decode_report),
    (NODE_REPORTS, p.NODE_REPORTS, p.decode_node_report),
    (MESSAGES, p.MESSAGES, p.decode_message),
    (COMMANDS, p.COMMANDS, p.decode_command),
]


def _through_json(wire: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(wire))


@pytest.mark.parametrize("samples,family,decode", FAMILIES)
def test_every_message_round_trips_through_its_decoder(samples, family, decode):
    assert {type(m) for m in samples} == set(family.values())  # every kind has a sample
    for message in samples:
        assert decode(_through_json(message.to_wire())) == message


@pytest.mark.parametrize("message", OTHERS, ids=lambda m: type(m).__name__)
def test_requests_and_answers_round_trip(message):
    assert type(message).from_wire(_through_json(message.to_wire())) == message


def test_the_wire_keeps_its_shape():
    assert p.Abort(generation=3).to_wire() == {"type": "abort", "generation": 3}
    assert p.Finish().to_wire() == p.FinishNode().to_wire() == {"type": "finish"}
    assert p.StartSpare().to_wire() == {"type": "start_spare"}
    assert p.Signal(process="w", signal=9).to_wire() == {
        "type": "signal",
        "process": "w",
        "signal": 9,
    }
    assert p.Signal(process="w", signal=9, stacks=True).to_wire()["stacks"] is True
    assert p.Chaos(fault="partition", seconds=5.0).to_wire() == {
        "type": "chaos",
        "fault": "partition",
        "seconds": 5.0,
    }
    # Optional fields that are not set stay off the wire, as they were.
    assert p.Halted(committed=3, in_flight=None).to_wire() == {
        "kind": "halted",
        "committed": 3,
        "in_flight": None,
    }
    assert p.Done(generation=0, step=9).to_wire() == {"kind": "done", "generation": 0, "step": 9}
    # Fields the decoder does not know (the client's "process", a newer sender's) are ignored.
    assert p.decode_report({"kind": "ready", "process": "spare0", "new": 1}) == p.Ready()


COPY = {"type": "copy", "kind": "clone", "process": "w1", "slot": 0, "generation": 1, "ordered": 5}
NO_REASON = {"event": "copy_failed", "t": 1.0, "process": "w1", "kind": "clone"}

MALFORMED = [
    (p.decode_report, {"kind": "halted", "generation": 0}, "halted: missing field 'committed'"),
    (p.decode_report, {"kind": "progress", "step": "5"}, "progress: step '5' is not a step"),
    (p.decode_report, {"kind": "progress", "step": -2}, "step -2 is not a step number"),
    (p.decode_report, {"kind": "done", "step": True}, "done: step True is not a step number"),
    (p.decode_report, {"kind": "progress", "step": 1.5}, "step 1.5 is not a step number"),
    (p.decode_report, {"kind": "max_steps", "max_steps": -1}, "max_steps -1 is not a number"),
    (p.decode_report, {"kind": "progress", "step": 1, "generation": -3}, "generation -3"),
    (p.decode_report, {"kind": "progress", "step": 1, "step_age": "x"}, "step_age 'x' is not"),
    (p.decode_report, {"kind": "progress", "step": 1, "step_age": float("nan")}, "step_age nan"),
    (p.decode_report, {"kind": "warning", "message": "m", "objects": [1]}, "objects [1] is not"),
    (p.decode_report, {"kind": "explode"}, "unknown report kind 'explode'"),
    (p.decode_report, {"step": 1}, "unknown report kind None"),
    (p.decode_report, {"kind": ["progress"]}, "unknown report kind ['progress']"),
    (p.decode_report, [1, 2], "a report must be a JSON object, not list"),
    (p.decode_node_report, {"kind": "exit", "exited": "w0"}, "missing field 'returncode'"),
    (p.decode_node_report, {"kind": "reboot"}, "unknown node report kind 'reboot'"),
    (p.decode_message, {"type": "plan", "generation": 1}, "plan: missing field"),
    (p.decode_message, {"type": "abort", "generation": -1}, "abort: generation -1 is not"),
    (p.decode_message, {**PLAN, "members": [[0, 1], [2, 3]]}, "plan: members: not runs"),
    (p.decode_message, {**PLAN, "sources": [[3, 1]]}, "plan: sources: not runs"),
    (p.decode_message, {**PLAN, "members": [[0]]}, "plan: members: not runs"),
    (p.decode_message, {**PLAN, "members": [[-1, 2]]}, "plan: members: not runs"),
    (p.decode_message, {**PLAN, "sources": [0, 1]}, "plan: sources [0, 1] is not"),
    (p.decode_command, {"type": "chaos", "fault": "flood"}, "unknown node fault 'flood'"),
    (p.decode_command, {"type": "signal", "process": "w", "signal": 0}, "signal 0 is not"),
    (p.decode_command, {**COPY, "kind": "fork"}, "copy: unknown kind of copy 'fork'"),
    (p.decode_command, {**COPY, "slot": -1}, "copy: slot -1 is not a slot"),
    (p.decode_command, {**COPY, "generation": "1"}, "copy: generation '1' is not"),
    (p.decode_command, {**COPY, "ordered": None}, "copy: ordered None is not"),
    (p.decode_node_report, {"kind": "copied", "event": []}, "copied: event [] is not"),
    (p.decode_node_report, {"kind": "copied"}, "copied: missing field 'event'"),
    (p.decode_node_report, {"kind": "copied", "event": {"event": "job_end", "t": 1.0}}, "job_end"),
    (p.decode_node_report, {"kind": "copied", "event": {"event": "copy_failed"}}, "t None"),
    (p.decode_node_report, {"kind": "copied", "event": NO_REASON}, "missing field 'reason'"),
    (p.JoinRequest.from_wire, {"role": "boss", "pid": 1, "node": "n"}, "unknown role 'boss'"),
    (p.JoinRequest.from_wire, {"role": "worker", "pid": 1, "node": "n", "slot": -1}, "slot -1"),
]


def test_a_copys_outcome_comes_back_as_the_ledger_event_it_was():
    cloned = ReplicaCloned(
        donor="worker1",
        process="node1-spare0",
        slot=0,
        generation=1,
        ordered=1.0,
        parked=1.5,
        dumped=2.0,
        restored=2.5,
        bytes=10**8,
        dump_seconds=0.5,
        restore_seconds=0.5,
        t=3.0,
    )
    sent = p.CopyOutcome(event=cloned.to_json()).to_wire()
    assert sent["kind"] == "copied" and sent["event"]["event"] == "replica_cloned"
    assert p.decode_node_report(_through_json(sent)).outcome() == cloned


@pytest.mark.parametrize("decode,wire,message", MALFORMED)
def test_malformed_messages_are_refused_with_one_line(decode, wire, message):
    with pytest.raises(p.ProtocolError) as refused:
        decode(wire)
    assert message in str(refused.value) and "\n" not in str(refused.value)


EVENTS = [
    ev.JobStart(world_size=4, spares=1, script="train.py", args=("--steps", "10"), run_dir="r"),
    ev.JobEnd(status="failed", reason="why", steps_committed=3, rejected_requests={"x": 2}),
    ev.ProcessJoin(process="spare0", role="spare", slot=None, pid=12, node="node0"),
    ev.ProcessExit(process="worker1", slot=1, returncode=-9, cause="SIGKILL", state="active"),
    ev.ProcessExit(process="spare3", returncode=1, note="exited before joining"),
    ev.Failure(
        slot=1,
        process="worker1",
        last_reported_step=4,
        cause="SIGKILL",
        kind="signal",
        detected_by="process exit",
        generation=0,
        onset=10.0,
        step=5,
    ),
    ev.HangDetected(
        process="w", slot=0, detection="heartbeat", reason="r", silent_seconds=3.0, timeout=2.0
    ),
    ev.Straggler(process="w", slot=1, compute_seconds=0.5, peers_median=0.1, slowdown=5.0),
    ev.RecoveryStart(generation=0, slots=(1,)),
    ev.RecoveryPlanned(
        generation=1,
        target_step=4,
        sources=(0,),
        receivers=(1,),
        replaced={"1": "spare0"},
        lost_steps=0,
    ),
    ev.RecoveryFailed(process="spare0", slot=1, generation=1, reason="transfer failed"),
    ev.RecoveryFailed(generation=1, reason="late"),
    ev.RecoverySuperseded(generation=1),
    ev.RecoveryAbandoned(slots=(0, 1), step=5, reason="no spare"),
    ev.RecoveryDone(
        generation=1,
        slots=(1,),
        failures=({"process": "worker1", "onset": 10.0},),
        target_step=4,
        timeline={"detected": 10.0, "first_step": 11.0},
        recovery_seconds=1.0,
        stall_seconds=1.2,
        survivor_gap_seconds={"0": 1.5},
        bytes_transferred=4096,
        lost_steps=0,
        recomputed_steps=1,
        sources=(0,),
        receivers=(1,),
    ),
    ev.TrainingDone(steps_committed=10),
    ev.SpareReady(process="spare0"),
    ev.SpareLost(process="spare0", cause="SIGKILL", traceback=None),
    ev.NodeJoined(node="node1"),
    ev.NodeLost(node="node1", reason="silent", processes=("worker1",)),
    ev.HandoverRequested(
        slots=(1,),
        processes=("worker1",),
        reason="temperature 97 C >= 90 C on node0 device 1",
        since=10.0,
        trigger={"node": "node0", "device": 1, "temperature_c": 97.0},
    ),
    ev.HandoverStart(slots=(1,), generation=0, boundary=27),
    ev.HandoverLate(process="worker0", slot=0, step=27),
    ev.HandoverDone(
        slots=(1,),
        generation=1,
        target_step=27,
        replaced={"1": "spare0"},
        retired=("worker1",),
        reason="drain",
        since=10.0,
        lead_seconds=2.0,
        stall_seconds=0.2,
        recomputed_steps=0,
        lost_steps=0,
        bytes_transferred=1024,
    ),
    ev.HandoverAbandoned(slots=(1,), reason="no spare"),
    ev.JobShrunk(
        generation=1, slots=(1,), hosts={"1": 0}, processes=2, target_step=4, reason="SIGKILL"
    ),
    ev.JobGrown(generation=2, slots=(1,), processes={"1": "spare0"}, hosts={}, target_step=28),
    ev.PoolAttached(pool="127.0.0.1:7", slots=(0, 1), priority=10, min_nproc=2),
    ev.PoolAsked(slots=1, pool="127.0.0.1:7"),
    ev.PoolGranted(slot=1, lender="L", loan=0),
    ev.PoolGranted(slot=2),
    ev.PoolRefused(reason="no idle slot and no lender (L: recovering)"),
    ev.PoolLend(loan=0, borrower="H", slot=1),
    ev.PoolLend(loan=1, borrower="H", refused="a recovery or handover is under way"),
    ev.PoolReturned(loan=0, slot=1),
    ev.PoolLend(loan=2, borrower="H", kind="park"),
    ev.JobParked(loan=2, borrower="H", step=22, processes=("worker0", "worker1")),
    ev.JobUnparked(loan=2, slots=(0, 1), step=22, parked_seconds=7.5),
    ev.ControllerTakeover(
        leader="node1",
        previous="node0",
        term=9,
        generation=2,
        committed=41,
        control="10.0.0.2:4001",
        store="10.0.0.2:4002",
    ),
    ev.ReplicaCloned(
        donor="worker0",
        process="spare0",
        slot=1,
        generation=0,
        ordered=1.0,
        parked=1.2,
        dumped=1.5,
        restored=1.8,
        bytes=233_000_000,
        dump_seconds=0.3,
        restore_seconds=0.3,
    ),
    ev.WorkerMigrated(
        process="worker0",
        slot=0,
        generation=1,
        ordered=1.0,
        parked=1.2,
        dumped=1.5,
        restored=1.8,
        bytes=233_000_000,
        dump_seconds=0.3,
        restore_seconds=0.3,
    ),
    ev.CopyFailed(process="worker0", kind="clone", reason="criu dump failed"),
    ev.FencedRefused(process="worker1", slot=1, generation=0, current_generation=1),
    ev.FencedRefused(node="node1", kind="heartbeat"),
    ev.ClaimRefused(process="worker0", kind="done", reason="r"),
    ev.WarningEvent(process="w", slot=0, step=3, what="x", objects=("m",), message="differs"),
    ev.ChaosRequested(fault="partition", node="node1", seconds=5.0),
    ev.ChaosInjected(node="node1", fault="partition", ok=False, error="no nft"),
    ev.ChaosFired(process="worker0", id=0, action="kill", rank=0, step=3),
    ev.Rejected(reason="unauthenticated", count=1, detail="d", peer="ipv4:1.2.3.4:5"),
    ev.RejectedSummary(reason="unauthenticated", count=64, detail="d", peer="p"),
    ev.Bench(overhead=0.02),
    ev.Progress(step=11),
    ev.CheckpointSaved(step=9, path="/ck/step-9"),
    ev.Resumed(
        from_step=9, checkpoint="/ck/step-9", last_committed=11, steps_replayed=2, skipped=("x",)
    ),
    ev.FallbackRestart(
        reason="no live replica survives", from_step=9, checkpoint="c", steps_lost=2, attempt=1
    ),
]


def test_every_event_round_trips_through_its_ledger_line():
    assert {type(e) for e in EVENTS} == set(ev.EVENTS.values())
    for event in EVENTS:
        line = json.loads(json.dumps(event.to_json()))
        assert list(line)[:2] == ["t", "event"] and line["event"] == event.TAG
        assert isinstance(line["t"], float)  # stamped when written, unless the event has one
        stamped = type(event).from_json({**event.to_json(), "t": 5.0})
        assert ev.parse_event(_through_json(stamped.to_json())) == stamped


@pytest.mark.parametrize(
    "line,message",
    [
        ({"t": 1.0, "event": "failure"}, "failure: missing field 'slot'"),
        ({"t": 1.0, "event": "training_done", "steps_committed": "ten"}, "steps_committed"),
        ({"t": "noon", "event": "spare_ready", "process": "s"}, "t 'noon' is not a time"),
        ({"event": "spare_ready", "process": "s"}, "t None is not a time"),
    ],
)
def test_malformed_events_are_refused_with_one_line(line, message):
    with pytest.raises(LedgerError, match=message):
        ev.parse_event(line)


def test_unknown_events_are_skipped_and_malformed_ones_refused_unless_tolerant(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    lines = [
        ev.SpareReady(process="spare0", t=1.0).to_json(),
        {"t": 2.0, "event": "from_a_newer_version", "anything": [1]},
        {"t": 3.0, "event": "training_done"},
    ]
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert ev.read_events(ledger, strict=False) == [ev.SpareReady(process="spare0", t=1.0)]
    with pytest.raises(LedgerError, match="has a malformed event: training_done: missing"):
        ev.read_events(ledger)


@pytest.mark.slow
def test_a_real_jobs_ledger_reads_entirely_into_typed_events(tmp_path: Path) -> None:
    job = run_job(tmp_path, chaos=("kill:rank=1:step=3",), steps=6)
    assert job.returncode == 0, job.output
    path = tmp_path / "ledger.jsonl"
    lines = read_ledger(path)
    typed = ev.read_events(path)  # strict: a malformed line would raise
    assert [e.TAG for e in typed] == [line["event"] for line in lines]  # none unknown
    assert [e.to_json() for e in typed] == lines  # and each reads back to its very line
    assert all(isinstance(line["t"], float) for line in lines)
    kinds = {type(e) for e in typed}
    assert {ev.JobStart, ev.Failure, ev.RecoveryPlanned, ev.RecoveryDone, ev.JobEnd} <= kinds
