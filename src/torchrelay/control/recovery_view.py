"""The recovery in progress as plain JSON, for the status RPC (``torchrelay status``, the
launcher's progress lines and the metrics). A read-only view: nothing here decides."""

from __future__ import annotations

from typing import Any

from torchrelay.control.state import RecoveryState


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
