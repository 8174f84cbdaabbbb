"""What `torchrelay status` shows, from a status snapshot and ledger events (no job): the view,
the step rate over polls, one line per event, and the ledger tail read as it is written."""

from __future__ import annotations

import json
from dataclasses import fields

from rich.console import Console

from torchrelay import events
from torchrelay.cli.status_view import StepRate, describe_event, render
from torchrelay.cli.watch import LedgerTail


def member(process: str, slot: int | None, state: str, **extra) -> dict:
    return {
        "process": process,
        "pid": 100 + len(process),
        "node": "node0",
        "role": "worker" if slot is not None else "spare",
        "slot": slot,
        "state": state,
        "committed": 41,
        "seconds_since_heartbeat": 0.4,
        **extra,
    }


STATUS = {
    "generation": 2,
    "world_size": 2,
    "slots": [
        member("worker0", 0, "halted", step_seconds=0.25),
        member("spare1", 1, "active", step_seconds=0.35),
    ],
    "spares": [member("spare2", None, "starting")],
    "steps_committed": 42,
    "recovering": True,
    "recovery": {
        "step": "halt",
        "slots": [1],
        "failures": 1,
        "detected": 1000.0,
        "seconds": 2.5,
        "seconds_in_step": 0.5,
        "step_limit": 120.0,
        "generation": None,
        "target_step": None,
        "receivers": [],
        "phases": {},
    },
    "hang_timeout": 10.0,
    "nodes": {},
    "stragglers": [{"slot": 0, "slowdown": 2.5}],
    "rejected_requests": {"bad_seal": 3},
    "outcome": None,
}


def text(renderable) -> str:
    console = Console(record=True, width=160)
    console.print(renderable)
    return console.export_text()


def test_the_view_shows_slots_spares_rate_recovery_and_events():
    failed = events.Failure(
        slot=1,
        process="worker1",
        last_reported_step=40,
        cause="SIGKILL",
        kind="signal",
        detected_by="process exit (waitpid)",
        t=1000.0,
    )
    shown = text(render(STATUS, [failed], 3.5, "torchrelay runs/x"))
    assert "generation 2 · 42 steps committed · 3.50 steps/s · 0.300 s/step" in shown
    assert "spares 0 ready, 1 starting" in shown
    assert "RECOVERING slot(s) [1] for 2.5 s: waiting for halt (0.5 s of 120 s)" in shown
    for name in ("worker0", "spare1", "spare2", "halted", "starting"):
        assert name in shown
    assert "straggler: slot 0 computes 2.5x slower" in shown
    assert "control requests refused: bad_seal 3" in shown
    assert "slot 1 failed: SIGKILL [signal] (worker1, process exit (waitpid))" in shown


def test_a_healthy_job_and_a_round_not_yet_described():
    healthy = {**STATUS, "recovering": False, "recovery": None, "stragglers": []}
    assert "healthy: no recovery" in text(render(healthy, [], None, "t"))
    starting = {**STATUS, "recovery": None}
    assert "recovering (starting)" in text(render(starting, [], None, "t"))
    planned = dict(STATUS["recovery"], step="done", target_step=7, phases={"comm_ready": [0, 1]})
    shown = text(render({**STATUS, "recovery": planned}, [], None, "t"))
    assert "resuming after step 7; phases done: comm_ready 2" in shown


def sample(cls: type[events.Event]) -> events.Event:
    """An instance of ``cls`` with a value of the right kind in every field."""
    values = {"t": 1.0}
    for f in fields(cls):
        kind = str(f.type)
        if f.name == "t":
            continue
        if "tuple" in kind:
            values[f.name] = (1,)
        elif kind.startswith("dict"):
            values[f.name] = {"1": "spare0"}
        elif kind.startswith("int"):
            values[f.name] = 3
        elif kind.startswith("float"):
            values[f.name] = 1.5
        elif kind.startswith("bool"):
            values[f.name] = True
        else:
            values[f.name] = "x"
    return cls(**values)


def test_every_event_has_a_line():
    for cls in events.EVENTS.values():
        line = describe_event(sample(cls))
        assert line and "{" not in line.replace("{'1'", ""), (cls, line)


def test_the_step_rate_is_over_the_recent_polls():
    rate = StepRate(window=10.0)
    assert rate.rate() is None
    rate.add(0.0, 0)
    assert rate.rate() is None
    rate.add(1.0, 2)
    assert rate.rate() == 2.0
    for t in range(2, 31):  # steady 2 steps/s, then a stall
        rate.add(float(t), 2 * t)
    for t in range(31, 36):
        rate.add(float(t), 60)
    # Over the last ~10 s: 10 steps in 10 s, not the whole run's 60 in 35.
    assert rate.rate() == 1.0


def test_the_ledger_tail_reads_what_was_added_and_waits_for_torn_lines(tmp_path):
    path = tmp_path / "ledger.jsonl"
    tail = LedgerTail(path, keep=3)
    tail.poll()  # not written yet
    assert list(tail.recent) == []
    lines = [
        json.dumps({"t": 1.0, "event": "spare_ready", "process": f"spare{n}"}) for n in range(4)
    ]
    with path.open("w") as ledger:
        ledger.write(lines[0] + "\nnot json\n")
        ledger.write(json.dumps({"t": 1.0, "event": "from_a_newer_version"}) + "\n")
        ledger.write(json.dumps({"t": 1.0, "event": "failure"}) + "\n")  # malformed
        ledger.write(lines[1] + "\n" + lines[2][:10])  # torn mid-line
    tail.poll()
    assert [e.process for e in tail.recent] == ["spare0", "spare1"]
    with path.open("a") as ledger:
        ledger.write(lines[2][10:] + "\n" + lines[3] + "\n")
        end = {"t": 2.0, "event": "job_end", "status": "succeeded", "steps_committed": 5}
        ledger.write(json.dumps(end) + "\n")
    tail.poll()
    assert [e.TAG for e in tail.recent] == ["spare_ready", "spare_ready", "job_end"]
    assert tail.ended is not None and tail.ended.status == "succeeded"
