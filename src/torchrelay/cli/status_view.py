"""What ``torchrelay status`` shows: a running job's status snapshot and its recent ledger
events, as one ``rich`` renderable. Pure: the same snapshot renders the same view, so it is
tested without a job. Imports neither torch nor the controller."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from torchrelay.events import (
    ChaosFired,
    Event,
    Failure,
    HangDetected,
    JobEnd,
    JobGrown,
    JobShrunk,
    NodeLost,
    ProcessExit,
    ProcessJoin,
    RecoveryAbandoned,
    RecoveryDone,
    RecoveryFailed,
    RecoveryPlanned,
    RecoveryStart,
    SpareLost,
    SpareReady,
    Straggler,
    TrainingDone,
)
from torchrelay.events_criu import CopyFailed, ReplicaCloned, WorkerMigrated

RECENT = 8
"""Ledger events shown under the slots."""


class StepRate:
    """Committed steps per second over the polls of the last ``window`` seconds."""

    def __init__(self, window: float = 10.0) -> None:
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, steps: int) -> None:
        self._samples.append((t, steps))
        while len(self._samples) > 2 and t - self._samples[1][0] >= self._window:
            self._samples.popleft()

    def rate(self) -> float | None:
        """Steps per second; ``None`` before two polls some time apart."""
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def _slot_name(slot: int | None) -> str:
    return "job" if slot is None else f"slot {slot}"


def describe_event(event: Event) -> str:
    """One short line for the event view."""
    e: Any = event
    if isinstance(e, Failure):
        return f"{_slot_name(e.slot)} failed: {e.cause} [{e.kind}] ({e.process}, {e.detected_by})"
    if isinstance(e, RecoveryDone):
        return (
            f"recovered slot(s) {list(e.slots)} into generation {e.generation} in "
            f"{e.recovery_seconds:.2f} s: lost {e.lost_steps}, recomputed {e.recomputed_steps}, "
            f"{e.bytes_transferred / 2**20:.1f} MB"
        )
    lines: dict[type, str] = {
        RecoveryStart: "recovery of slot(s) {slots} started (generation {generation})",
        RecoveryPlanned: "plan: generation {generation} resumes after step {target_step}, "
        "replacing {replaced}",
        RecoveryFailed: "plan of generation {generation} failed: {reason}",
        RecoveryAbandoned: "recovery of slot(s) {slots} abandoned: {reason}",
        HangDetected: "{process} silent for {silent_seconds:.1f} s ({detection})",
        Straggler: "{process} is {slowdown:.1f}x slower than its peers",
        ProcessJoin: "{process} joined as {role} on {node} (pid {pid})",
        ProcessExit: "{process} exited ({returncode})",
        SpareReady: "{process} ready as a spare",
        SpareLost: "spare {process} lost: {cause}",
        NodeLost: "{node} lost: {reason}",
        ChaosFired: "chaos: {action} on rank {rank} at step {step}",
        JobShrunk: "shrunk to {processes} processes from generation {generation}: hosted "
        "slot -> host {hosts} ({reason})",
        JobGrown: "slot(s) {slots} regrown on {processes} (generation {generation})",
        TrainingDone: "training done: {steps_committed} steps",
        JobEnd: "job {status}: {steps_committed} steps committed",
        ReplicaCloned: "{donor} cloned into {process} for slot {slot} (dump {dump_seconds:.2f} s, "
        "restore {restore_seconds:.2f} s, {bytes} bytes)",
        WorkerMigrated: "{process} moved into a copy of itself (dump {dump_seconds:.2f} s, "
        "restore {restore_seconds:.2f} s, {bytes} bytes)",
        CopyFailed: "{kind} of {process} failed: {reason}",
    }
    template = lines.get(type(e))
    if template is None:
        return e.TAG
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(e).items()}
    return template.format(**fields)


def _header(status: dict[str, Any], rate: float | None, title: str) -> Text:
    steps = [m["step_seconds"] for m in status["slots"] if "step_seconds" in m]
    step_time = f"{statistics.median(steps):.3f} s/step" if steps else "step time -"
    ready = sum(1 for m in status["spares"] if m["state"] == "ready")
    header = Text(f"{title}  ", style="bold")
    header.append(
        f"generation {status['generation']} · {status['steps_committed']} steps committed · "
        f"{'-' if rate is None else f'{rate:.2f}'} steps/s · {step_time} · "
        f"spares {ready} ready, {len(status['spares']) - ready} starting · "
        f"hang timeout {status['hang_timeout']:.1f} s"
    )
    return header


def _recovery(status: dict[str, Any]) -> Text:
    recovery = status.get("recovery")
    if status.get("parked"):
        return Text("parked: every process halted, its slots lent to the pool", style="yellow")
    if recovery is None:
        line = "recovering (starting)" if status["recovering"] else "healthy: no recovery"
        return Text(line, style="bold red" if status["recovering"] else "green")
    done = ", ".join(f"{p} {len(s)}" for p, s in recovery["phases"].items())
    target = recovery["target_step"]
    return Text(
        f"RECOVERING slot(s) {recovery['slots']} for {recovery['seconds']:.1f} s: waiting for "
        f"{recovery['step']} ({recovery['seconds_in_step']:.1f} s of {recovery['step_limit']:.0f}"
        f" s)"
        + ("" if target is None else f", resuming after step {target}")
        + (f"; phases done: {done}" if done else ""),
        style="bold red",
    )


def _members(status: dict[str, Any]) -> Table:
    table = Table(expand=False)
    for column in ("slot", "process", "node", "pid", "state", "committed", "step s", "heard s"):
        table.add_column(column, justify="right" if column != "process" else "left")
    for m in status["slots"] + status["spares"]:
        step = m.get("step_seconds")
        hosts = m.get("hosts") or []
        cells = (
            "spare"
            if m["slot"] is None
            else str(m["slot"]) + (f" +{','.join(map(str, hosts))}" if hosts else ""),
            m["process"],
            m["node"],
            str(m["pid"]),
            m["state"],
            str(m["committed"]),
            "-" if step is None else f"{step:.3f}",
            f"{m['seconds_since_heartbeat']:.1f}",
        )
        table.add_row(*map(Text, cells))  # Text: names are shown as they are, never as markup
    return table


def _events(events: list[Event]) -> Table:
    table = Table(title="recent events", title_justify="left", show_header=False, box=None)
    table.add_column("time", style="dim")
    table.add_column("event", style="bold")
    table.add_column("what")
    for event in events:
        at = time.strftime("%H:%M:%S", time.localtime(event.t)) if event.t else "-"
        table.add_row(at, event.TAG, Text(describe_event(event)))
    return table


def render(
    status: dict[str, Any], events: list[Event], rate: float | None, title: str
) -> RenderableType:
    """The whole view: header, recovery line, slots and spares, nodes, stragglers, refused
    control requests, events."""
    parts: list[RenderableType] = [_header(status, rate, title), _recovery(status)]
    parts.append(_members(status))
    hosted = status.get("hosted") or {}
    if hosted:
        pairs = ", ".join(f"slot {v} on slot {h}'s process" for v, h in hosted.items())
        parts.append(Text(f"elastic: {len(hosted)} slot(s) hosted: {pairs}", style="yellow"))
    for name, node in status["nodes"].items():
        state = "alive" if node["alive"] else "LOST"
        parts.append(Text(f"{name}: {state}, heard {node['seconds_since_heartbeat']:.1f} s ago"))
    for s in status["stragglers"]:
        parts.append(
            Text(f"straggler: slot {s['slot']} computes {s['slowdown']:.1f}x slower than its peers")
        )
    refused = status.get("rejected_requests") or {}
    if refused:
        counts = ", ".join(f"{reason} {n}" for reason, n in sorted(refused.items()))
        parts.append(Text(f"control requests refused: {counts}", style="yellow"))
    if events:
        parts.append(_events(events[-RECENT:]))
    return Group(*parts)
