"""The job as plain JSON for the status RPC (``torchrelay status``, ``torchrelay chaos``, the
launcher's progress lines and the metrics). A read-only view: nothing here decides."""

from __future__ import annotations

from typing import Any

from torchrelay.config import JobConfig
from torchrelay.control import parking
from torchrelay.control.state import JobState, Member, MemberState, RecoveryState, Role


def describe_job(
    job: JobState, config: JobConfig, rejected: dict[str, int], now: float
) -> dict[str, Any]:
    """Slots, spares, nodes, steps, the recovery in progress and the outcome; ``rejected``:
    the control requests refused so far, by reason."""

    def describe(m: Member) -> dict[str, Any]:
        return {
            "process": m.process,
            "pid": m.pid,
            "node": m.node,
            "role": m.role.value,
            "slot": m.slot,
            "state": m.state.value,
            "committed": m.committed,
            # --elastic: the slots whose micro-batches this process runs besides its own
            "hosts": sorted(v for v, h in job.hosted.items() if h == m.slot),
            "seconds_since_heartbeat": now - m.last_seen,
            **m.timings,
        }

    waiting = (MemberState.STARTING, MemberState.READY)
    return {
        "generation": job.generation,
        "world_size": config.world_size,
        "leader": job.leader_node,
        "slots": [describe(job.members[p]) for _, p in sorted(job.assignments.items())],
        "hosted": {str(v): h for v, h in sorted(job.hosted.items())},
        "spares": [
            describe(m)
            for m in job.members.values()
            if m.role is Role.SPARE and m.slot is None and m.state in waiting
        ],
        "steps_committed": job.highest_committed + 1,
        "recovering": job.recovery.current is not None and not parking.parked(job),
        "parked": parking.parked(job),
        "recovery": describe_recovery(job.recovery, now),
        "hang_timeout": job.hang_timeout,
        "nodes": {
            n.name: {"alive": n.alive, "seconds_since_heartbeat": now - n.last_seen}
            for n in job.nodes.values()
        },
        "stragglers": list(job.stragglers.values()),
        "rejected_requests": rejected,
        "outcome": job.outcome,
    }


def describe_recovery(recovery: RecoveryState, now: float) -> dict[str, Any] | None:
    """The current round: its step (a :class:`~torchrelay.control.state.RecoveryStep` value),
    the failed slots, how long it and its step have run, the step's limit, the plan's target
    step and which slots finished each phase; ``None`` when no round is under way."""
    current = recovery.current
    if current is None:
        return None
    plan = current.plan
    return {
        "step": current.step.value,
        "slots": list(current.slots),
        "failures": len(current.failures),
        "detected": current.detected,
        "seconds": now - current.detected,
        "seconds_in_step": now - current.step_since,
        "step_limit": current.step_limit,
        "generation": None if plan is None else plan.generation,
        "target_step": None if plan is None else plan.target_step,
        "receivers": [] if plan is None else list(plan.receivers),
        "phases": {phase: sorted(done) for phase, done in current.phases.items()},
    }
