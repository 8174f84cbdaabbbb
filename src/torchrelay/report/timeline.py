"""A run's progress and stalls over wall-clock time, derived from its ledger events.

The ledger does not log every committed step (progress reports are frequent, so they are not
ledger lines). It does record the committed step count at a few moments, and these are the
only points this module returns (:class:`ProgressPoint`, each naming the event it comes from):

* ``job_start``: 0 steps committed;
* the last of the first ``world_size`` workers to join: still 0 (no step commits before every
  rank is there);
* each ``recovery_done``: ``target_step + 1 + lost_steps`` committed when the failure began
  (its onset), ``target_step + 1`` when the first step after the recovery ran;
* each failure no recovery followed: the step it was in flight (summary's ``step``);
* ``training_done`` and ``job_end``: ``steps_committed``.

A plot may join these points, but the line between two of them is an interpolation, not a
measurement. Stall windows (:class:`Stall`) are exact: a recovery stalls training from its
earliest failure's onset to its first step (``stall_seconds`` in the ledger); a failure that
was never recovered stalls it to the end of the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProgressPoint:
    """``steps`` committed at ``t`` seconds after the job started, as ``source`` records."""

    t: float
    steps: int
    source: str


@dataclass(frozen=True)
class Stall:
    """Training stalled from ``start`` to ``end`` (seconds after the job started) for the
    failures numbered ``failures`` (indices into the summary's failure list)."""

    start: float
    end: float
    failures: tuple[int, ...]
    recovered: bool


@dataclass(frozen=True)
class Timeline:
    """Everything the progress plot and the goodput headline need, in job-relative seconds."""

    start: float  # unix time of job_start: the origin of every other time here
    wall_seconds: float  # to job_end, or to the last event while the job runs
    points: tuple[ProgressPoint, ...]
    stalls: tuple[Stall, ...]

    @property
    def stalled_seconds(self) -> float:
        """Wall time during which at least one stall was open (overlaps counted once)."""
        total, reach = 0.0, 0.0
        for stall in sorted(self.stalls, key=lambda s: s.start):
            start, end = max(stall.start, reach, 0.0), min(stall.end, self.wall_seconds)
            if end > start:
                total += end - start
            reach = max(reach, end)
        return total

    @property
    def goodput(self) -> float | None:
        """Useful time over wall time, useful meaning not stalled by a failure; None for a
        run with no measurable wall time."""
        if self.wall_seconds <= 0:
            return None
        return 1.0 - self.stalled_seconds / self.wall_seconds


def failure_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ledger's ``failure`` events, in the order summarize() lists its failures."""
    return [e for e in events if e["event"] == "failure"]


def build_timeline(events: list[dict[str, Any]], summary: dict[str, Any]) -> Timeline:
    """The progress points and stall windows of a ledger and its ``summarize()`` output.

    The clock starts at ``job_start``, or at the first event of a ledger without one (a
    controller's ledger written outside the launcher). ``events`` must not be empty.
    """
    start_event = next((e for e in events if e["event"] == "job_start"), events[0])
    start = float(start_event["t"])
    end_event = next((e for e in reversed(events) if e["event"] == "job_end"), None)
    end = float(end_event["t"] if end_event else max(e["t"] for e in events)) - start
    points = [ProgressPoint(0.0, 0, start_event["event"])]
    joined = [e for e in events if e["event"] == "process_join" and e.get("role") == "worker"]
    world = summary.get("world_size") or 0
    if world and len(joined) >= world:
        points.append(ProgressPoint(joined[world - 1]["t"] - start, 0, "all workers joined"))
    stalls: list[Stall] = []
    failures = failure_events(events)
    for recovery in (e for e in events if e["event"] == "recovery_done"):
        processes = {f["process"] for f in recovery["failures"]}
        numbers = tuple(i for i, f in enumerate(failures) if f["process"] in processes)
        first_step = recovery["timeline"]["first_step"] - start
        onset = first_step - recovery["stall_seconds"]
        committed = recovery["target_step"] + 1
        points.append(ProgressPoint(onset, committed + recovery["lost_steps"], "failure onset"))
        points.append(ProgressPoint(first_step, committed, "first step after recovery"))
        stalls.append(Stall(onset, first_step, numbers, recovered=True))
    for number, (event, entry) in enumerate(zip(failures, summary["failures"], strict=True)):
        if not entry["recovered"]:
            onset = float(event.get("onset", event["t"])) - start
            points.append(ProgressPoint(onset, entry["step"], "unrecovered failure"))
            stalls.append(Stall(onset, end, (number,), recovered=False))
    for name in ("training_done", "job_end"):
        for event in (e for e in events if e["event"] == name):
            points.append(ProgressPoint(event["t"] - start, event["steps_committed"], name))
    return Timeline(
        start=start,
        wall_seconds=end,
        points=tuple(sorted(points, key=lambda p: p.t)),
        stalls=tuple(sorted(stalls, key=lambda s: s.start)),
    )
