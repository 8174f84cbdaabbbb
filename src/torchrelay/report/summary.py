"""Summarise a run directory's ledger: failures, recoveries, lost and recomputed work.

The ledger is read into typed events (:mod:`torchrelay.events`): a malformed event is an error
(:class:`~torchrelay.ledger.LedgerError`), one of a newer version is skipped."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from torchrelay.events import (
    ChaosFired,
    CheckpointSaved,
    Event,
    Failure,
    FallbackRestart,
    FencedRefused,
    HandoverDone,
    HandoverLate,
    HandoverStart,
    HangDetected,
    JobEnd,
    JobGrown,
    JobShrunk,
    JobStart,
    RecoveryAbandoned,
    RecoveryDone,
    Rejected,
    Resumed,
    Straggler,
    read_events,
)

PHASES = (
    "detected",
    "spare_ready",
    "halted",
    "planned",
    "comm_ready",
    "transfer_done",
    "first_step",
)


def _handovers(events: list[Event]) -> list[dict[str, Any]]:
    """Each handover's outcome, with the ranks told its boundary too late (why one that is
    not a failure's redid a step)."""
    handovers: list[dict[str, Any]] = []
    late: list[int] = []
    for e in events:
        if isinstance(e, HandoverStart):
            late = []
        elif isinstance(e, HandoverLate) and e.slot is not None:
            late.append(e.slot)
        elif isinstance(e, HandoverDone):
            handovers.append(
                {
                    "slots": list(e.slots),
                    "reason": e.reason,
                    "resumed_at_step": e.target_step + 1,
                    "stall_seconds": e.stall_seconds,
                    "lead_seconds": e.lead_seconds,
                    "recomputed_steps": e.recomputed_steps,
                    "lost_steps": e.lost_steps,
                    "told_late": sorted(late),
                }
            )
    return handovers


def summarize(run_dir: Path) -> dict[str, Any]:
    """The machine-readable report of one run (what ``torchrelay report --json`` prints)."""
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a torchrelay run directory?")
    events = read_events(path)
    start = next((e for e in events if isinstance(e, JobStart)), None)
    end = next((e for e in reversed(events) if isinstance(e, JobEnd)), None)
    recoveries = [e for e in events if isinstance(e, RecoveryDone)]
    abandoned = [e for e in events if isinstance(e, RecoveryAbandoned)]
    fired = {e.process for e in events if isinstance(e, ChaosFired)}
    failures = []
    for event in (e for e in events if isinstance(e, Failure)):
        recovery = next(
            (r for r in recoveries if any(f["process"] == event.process for f in r.failures)),
            None,
        )
        entry = _failure_entry(event, recovery)
        # Whether a drill injected the fault into that process; else it failed by itself or
        # as a consequence of another failure (a survivor whose collective a kill left stuck).
        entry["injected"] = event.process in fired
        # A recovery given up for want of spares names the step in flight exactly.
        given_up = [a for a in abandoned if event.slot in a.slots and a.t >= event.t]  # type: ignore[operator]
        if recovery is None and given_up:
            entry["step"] = given_up[0].step
        failures.append(entry)
    recovered = [f for f in failures if f["recovered"]]
    return {
        "run_dir": str(run_dir),
        "status": end.status if end else "running",
        "reason": end.reason if end else None,
        "signal": end.signal if end else None,  # what terminated it (SIGTERM, SIGINT)
        "world_size": start.world_size if start else None,
        "wall_seconds": (end.t - start.t) if start and end else None,  # type: ignore[operator]
        "steps_committed": end.steps_committed if end else None,
        "failures": failures,
        "zero_loss_recoveries": sum(1 for f in recovered if f["lost_steps"] == 0),
        "recovered": len(recovered),
        "chaos_fired": sum(1 for e in events if isinstance(e, ChaosFired)),
        "stragglers": [
            {"process": e.process, "slot": e.slot, "slowdown": e.slowdown}
            for e in events
            if isinstance(e, Straggler)
        ],
        "handovers": _handovers(events),
        # --elastic: each time ranks were hosted or regrew (docs/elastic.md)
        "resizes": [
            {
                "change": "shrunk" if isinstance(e, JobShrunk) else "grown",
                "generation": e.generation,
                "slots": list(e.slots),
                "hosts": dict(e.hosts),
            }
            for e in events
            if isinstance(e, JobShrunk | JobGrown)
        ],
        "hangs_detected": sum(1 for e in events if isinstance(e, HangDetected)),
        "checkpoints_saved": sum(1 for e in events if isinstance(e, CheckpointSaved)),
        # Each resume from a durable checkpoint: an outage that is not zero-loss.
        "resumes": [
            {
                "from_step": e.from_step,
                "checkpoint": e.checkpoint,
                "steps_replayed": e.steps_replayed,
                "outage_seconds": e.outage_seconds,
                "skipped": list(e.skipped),
            }
            for e in events
            if isinstance(e, Resumed)
        ],
        # Each restart from a checkpoint when no live replica survived (not zero-loss either).
        "fallback_restarts": [
            {
                "from_step": e.from_step,
                "checkpoint": e.checkpoint,
                "steps_lost": e.steps_lost,
                "reason": e.reason,
            }
            for e in events
            if isinstance(e, FallbackRestart)
        ],
        "refused_messages": sum(1 for e in events if isinstance(e, FencedRefused))
        + _rejected(events, end),
    }


def _rejected(events: list[Event], end: JobEnd | None) -> int:
    """Requests the control server refused: the count in ``job_end``, or while the job runs,
    the highest count logged per reason (only a sample of them has a ledger line)."""
    if end is not None and end.rejected_requests is not None:
        return sum(end.rejected_requests.values())
    highest: dict[str, int] = {}
    for e in events:
        if isinstance(e, Rejected):  # a sample or a summary
            highest[e.reason] = max(highest.get(e.reason, 0), e.count)
    return sum(highest.values())


def _failure_entry(event: Failure, recovery: RecoveryDone | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": event.slot,
        "step": event.last_reported_step + 1 if event.step is None else event.step,
        "cause": event.cause,
        "kind": event.kind,
        "detected_by": event.detected_by,
        "recovered": recovery is not None,
        "recovery_seconds": None,
        "stall_seconds": None,
        "lost_steps": None,
        "recomputed_steps": None,
        "bytes_transferred": None,
    }
    if recovery is not None:
        timeline = recovery.timeline
        entry.update(
            step=recovery.target_step + 1,
            recovery_seconds=recovery.recovery_seconds,
            stall_seconds=recovery.stall_seconds,
            survivor_gap_seconds=recovery.survivor_gap_seconds or {},
            lost_steps=recovery.lost_steps,
            recomputed_steps=recovery.recomputed_steps,
            bytes_transferred=recovery.bytes_transferred,
            resumed_at_step=recovery.target_step + 1,
            phases={f"{a}->{b}": timeline[b] - timeline[a] for a, b in itertools.pairwise(PHASES)},
        )
    return entry


def render_text(summary: dict[str, Any]) -> str:
    """A readable report of :func:`summarize`'s output."""
    failures = summary["failures"]
    lines = [
        f"run {summary['run_dir']}: {summary['status']}"
        + (f" by {summary['signal']}" if summary.get("signal") else "")
        + (f" -- {summary['reason']}" if summary.get("reason") else ""),
        f"  steps committed: {summary['steps_committed']}   world size: {summary['world_size']}"
        + (f"   wall time: {summary['wall_seconds']:.1f} s" if summary["wall_seconds"] else ""),
        f"  failures: {len(failures)}   recovered: {summary['recovered']}   "
        f"zero-loss recoveries: {summary['zero_loss_recoveries']}/{len(failures)}",
    ]
    for r in summary.get("resumes", []):
        outage = (
            ""
            if r["outage_seconds"] is None
            else f" after an outage of {r['outage_seconds']:.1f} s"
        )
        lines.append(
            f"  - resumed{outage} from checkpoint step {r['from_step']} ({r['checkpoint']}): "
            f"{r['steps_replayed']} step(s) replayed, not zero-loss"
        )
        lines += [f"      skipped {why}" for why in r["skipped"]]
    for r in summary.get("fallback_restarts", []):
        lines.append(
            f"  - no live replica survived: every worker restarted from checkpoint step "
            f"{r['from_step']} ({r['checkpoint']}), {r['steps_lost']} step(s) lost"
        )
    for f in failures:
        who = "all ranks" if f["rank"] is None else f"rank {f['rank']}"
        head = f"  - {who} step {f['step']}: {f['cause']} ({f['detected_by']})"
        if not f["recovered"]:
            lines.append(head + " -- not recovered")
            continue
        phases = "  ".join(f"{k} {v * 1000:.0f} ms" for k, v in f["phases"].items())
        gaps = f.get("survivor_gap_seconds") or {}
        if gaps:  # what the survivors lived through: last commit before -> first commit after
            phases += "\n      survivors stalled (last commit -> next commit): " + ", ".join(
                f"rank {slot} {seconds * 1000:.0f} ms" for slot, seconds in gaps.items()
            )
        lines.append(
            f"{head}\n      recovered in {f['recovery_seconds']:.2f} s "
            f"(stall {f['stall_seconds']:.2f} s), resumed at step {f['resumed_at_step']}, "
            f"lost {f['lost_steps']} step(s), recomputed "
            f"{f['recomputed_steps']}, moved {f['bytes_transferred'] / 1e6:.3f} MB\n      {phases}"
        )
    for h in summary["handovers"]:
        ranks = ", ".join(map(str, h["slots"]))
        late = ", ".join(map(str, h["told_late"]))
        lines.append(
            f"  - handover of rank(s) {ranks} ({h['reason']}): resumed at step "
            f"{h['resumed_at_step']}, stall {h['stall_seconds']:.2f} s, lead "
            f"{h['lead_seconds']:.1f} s, recomputed {h['recomputed_steps']}, lost {h['lost_steps']}"
            + (f" (told the boundary late: rank(s) {late})" if late else "")
        )
    for r in summary.get("resizes", []):
        ranks = ", ".join(map(str, r["slots"]))
        hosted = ", ".join(f"rank {v} on slot {h}'s process" for v, h in r["hosts"].items())
        lines.append(
            f"  - {r['change']} from generation {r['generation']}: rank(s) {ranks}; "
            f"hosted now: {hosted or 'none'}"
        )
    return "\n".join(lines)
