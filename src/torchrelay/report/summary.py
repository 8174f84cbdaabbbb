"""Summarise a run directory's ledger: failures, recoveries, lost and recomputed work."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from torchrelay.ledger import read_ledger

PHASES = (
    "detected",
    "spare_ready",
    "halted",
    "planned",
    "comm_ready",
    "transfer_done",
    "first_step",
)


def summarize(run_dir: Path) -> dict[str, Any]:
    """The machine-readable report of one run (what ``torchrelay report --json`` prints)."""
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a torchrelay run directory?")
    events = read_ledger(path)
    start = next((e for e in events if e["event"] == "job_start"), None)
    end = next((e for e in reversed(events) if e["event"] == "job_end"), None)
    recoveries = [e for e in events if e["event"] == "recovery_done"]
    abandoned = [e for e in events if e["event"] == "recovery_abandoned"]
    failures = []
    for event in (e for e in events if e["event"] == "failure"):
        recovery = next(
            (r for r in recoveries if any(f["process"] == event["process"] for f in r["failures"])),
            None,
        )
        entry = _failure_entry(event, recovery)
        # A recovery given up for want of spares names the step in flight exactly.
        given_up = [a for a in abandoned if event["slot"] in a["slots"] and a["t"] >= event["t"]]
        if recovery is None and given_up:
            entry["step"] = given_up[0]["step"]
        failures.append(entry)
    recovered = [f for f in failures if f["recovered"]]
    return {
        "run_dir": str(run_dir),
        "status": end["status"] if end else "running",
        "reason": end.get("reason") if end else None,
        "signal": end.get("signal") if end else None,  # what terminated it (SIGTERM, SIGINT)
        "world_size": start["world_size"] if start else None,
        "wall_seconds": (end["t"] - start["t"]) if start and end else None,
        "steps_committed": end["steps_committed"] if end else None,
        "failures": failures,
        "zero_loss_recoveries": sum(1 for f in recovered if f["lost_steps"] == 0),
        "recovered": len(recovered),
        "chaos_fired": sum(1 for e in events if e["event"] == "chaos_fired"),
        "stragglers": [
            {k: e[k] for k in ("process", "slot", "slowdown")}
            for e in events
            if e["event"] == "straggler"
        ],
        "hangs_detected": sum(1 for e in events if e["event"] == "hang_detected"),
        "refused_messages": sum(1 for e in events if e["event"] == "fenced_refused")
        + _rejected(events, end),
    }


def _rejected(events: list[dict[str, Any]], end: dict[str, Any] | None) -> int:
    """Requests the control server refused: the count in ``job_end``, or while the job runs,
    the highest count logged per reason (only a sample of them has a ledger line)."""
    if end is not None and isinstance(end.get("rejected_requests"), dict):
        return sum(end["rejected_requests"].values())
    highest: dict[str, int] = {}
    for e in events:
        if e["event"] in ("rejected_message", "rejected_summary"):
            reason = str(e.get("reason"))
            highest[reason] = max(highest.get(reason, 0), int(e.get("count", 1)))
    return sum(highest.values())


def _failure_entry(event: dict[str, Any], recovery: dict[str, Any] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": event["slot"],
        "step": event.get("step", event["last_reported_step"] + 1),
        "cause": event["cause"],
        "kind": event["kind"],
        "detected_by": event["detected_by"],
        "recovered": recovery is not None,
        "recovery_seconds": None,
        "stall_seconds": None,
        "lost_steps": None,
        "recomputed_steps": None,
        "bytes_transferred": None,
    }
    if recovery is not None:
        timeline = recovery["timeline"]
        entry.update(
            step=recovery["target_step"] + 1,
            recovery_seconds=recovery["recovery_seconds"],
            stall_seconds=recovery["stall_seconds"],
            survivor_gap_seconds=recovery.get("survivor_gap_seconds", {}),
            lost_steps=recovery["lost_steps"],
            recomputed_steps=recovery["recomputed_steps"],
            bytes_transferred=recovery["bytes_transferred"],
            resumed_at_step=recovery["target_step"] + 1,
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
    return "\n".join(lines)
