"""Joins and reports: the transitions a process's own messages cause.

Pure functions over :class:`JobState` (``now`` is passed in): each changes the state in place
and returns the actions that carry the change out. A refused report raises
:class:`~torchrelay.control.actions.Refused` (with the ledger line to write first) or a
:class:`~torchrelay.control.errors.ProtocolError`; the state is then left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrelay.config import JobConfig
from torchrelay.control import drills
from torchrelay.control.actions import Action, Refused, Send, record
from torchrelay.control.claims import claimed_step, judge_claim, judge_max_steps
from torchrelay.control.endings import FINISH, finish_if_all_done
from torchrelay.control.errors import FencedError, ProtocolError
from torchrelay.control.spares import spare_accounted
from torchrelay.control.state import GONE, JobPhase, JobState, Member, MemberState, Role, move


def join(
    job: JobState,
    config: JobConfig,
    process: str,
    role: str,
    pid: int,
    node: str,
    slot: int | None,
    now: float,
) -> list[Action]:
    """Register a process; workers name their slot (only at job start), spares get one later."""
    try:
        member = Member(process, Role(role), node, pid, last_seen=now)
    except ValueError:
        raise ProtocolError(f"unknown role {role!r}") from None
    if process in job.members:
        raise ProtocolError(f"process {process!r} joined twice")
    if member.role is Role.WORKER:
        if slot is None or not 0 <= slot < config.world_size:
            raise ProtocolError(f"worker slot {slot!r} outside world size")
        if job.generation != 0 or slot in job.assignments:
            raise FencedError(
                f"slot {slot} is already filled in generation {job.generation}; "
                "a worker can only join at job start"
            )
        member.slot, member.generation = slot, 0
        move(member, MemberState.ACTIVE)
        job.assignments[slot] = process
    job.members[process] = member
    if member.role is Role.SPARE:
        spare_accounted(job, node)
    actions: list[Action] = []
    if job.phase is not JobPhase.RUNNING:
        # A refill spare that comes up after the job ended must not wait forever.
        actions.append(Send(process, FINISH))
    record_join = record("process_join", process=process, role=role, slot=slot, pid=pid, node=node)
    return [*actions, record_join]


Handler = Callable[[JobState, Member, dict[str, Any], float], list[Action]]


def report(
    job: JobState, process: str, kind: str, body: dict[str, Any], now: float
) -> list[Action]:
    """Handle one report from a process.

    Every report is fenced: one from a dead, fenced or superseded member is refused with a
    :class:`FencedError`. A step claim that does not fit the plan (see
    :mod:`torchrelay.control.claims`) is refused with a :class:`ProtocolError`, as is a
    ``max_steps`` that differs from the job's; both refusals are recorded in the ledger.
    """
    handler = HANDLERS.get(kind)
    if handler is None:
        raise ProtocolError(f"unknown report kind {kind!r}")
    member = job.member(process)
    _check_fence(job, member, body)
    _check_claim(job, member, kind, body)
    member.last_seen = now
    return handler(job, member, body, now)


def _check_fence(job: JobState, member: Member, body: dict[str, Any]) -> None:
    generation = body.get("generation", member.generation)
    stale = member.state in GONE or (
        member.role is Role.WORKER
        and isinstance(generation, int)
        and generation < job.generation
        and member.generation < job.generation
    )
    if stale:
        refused = record(
            "fenced_refused",
            process=member.process,
            slot=member.slot,
            generation=generation,
            current_generation=job.generation,
        )
        error = FencedError(
            f"process {member.process} (slot {member.slot}, generation {generation}) was "
            f"fenced out; the job is at generation {job.generation}"
        )
        raise Refused(error, [refused])


def _check_claim(job: JobState, member: Member, kind: str, body: dict[str, Any]) -> None:
    claim = claimed_step(kind, body)
    if claim is None:
        return
    channel, step = claim
    # A report of an older generation still in flight is checked against the plan only.
    current = body.get("generation") == member.generation
    floor = member.claims.get(channel) if current else None
    reason = judge_claim(kind, step, job.max_steps, floor)
    if reason is not None:
        _refuse(member, kind, reason)
    if current:
        member.claims[channel] = max(step, -1 if floor is None else floor)


def _refuse(member: Member, kind: str, reason: str) -> None:
    refused = record("claim_refused", process=member.process, kind=kind, reason=reason)
    raise Refused(ProtocolError(f"{member.process}: {reason}"), [refused])


def _on_max_steps(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    reason = judge_max_steps(body.get("max_steps"), job.max_steps)
    if reason is not None:
        _refuse(member, "max_steps", reason)
    job.max_steps = int(body["max_steps"])
    return []


def _on_progress(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    for key in ("step_seconds", "compute_seconds"):
        if key in body:
            member.timings[key] = float(body[key])
    if "step_age" in body:
        member.step_age = _seconds(body["step_age"])
        member.waiting = _seconds(body.get("waiting"))
        member.busy = body.get("busy") is not None
    step = int(body["step"])
    member.committed = max(member.committed, step)
    actions: list[Action] = []
    if step > job.highest_committed:
        job.highest_committed = step
        actions += drills.fire_node_chaos(job)
    current = job.recovery.current
    if (
        body.get("first_after_recovery")
        and current is not None
        and current.plan is not None
        and body.get("generation") == current.plan.generation
    ):
        phase_done(job, member, "first_step", body, now)
    return actions


def _on_ready(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    if member.role is not Role.SPARE or member.state is not MemberState.STARTING:
        raise ProtocolError(f"{member.process} reported ready but is {member.state.value}")
    move(member, MemberState.READY)
    return [record("spare_ready", process=member.process)]


def _on_halted(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    move(member, MemberState.HALTED)
    member.committed = int(body["committed"])
    if body.get("last_commit_t") is not None:
        member.last_commit_t = float(body["last_commit_t"])
    member.valid = bool(body.get("valid", True))
    recovery, actions = job.recovery, []
    current = recovery.current
    plan = current.plan if current is not None else None
    if plan is not None and body.get("generation") == plan.generation:
        # A member could not complete the published plan (its transfer failed or was
        # aborted): plan again with what is alive.
        recovery.replan = str(body.get("reason", "a member could not enter the generation"))
        failed = record(
            "recovery_failed",
            process=member.process,
            slot=member.slot,
            generation=plan.generation,
            reason=recovery.replan,
        )
        actions.append(failed)
    if current is not None and body.get("in_flight") is not None:
        current.in_flight.add(int(body["in_flight"]))
    job.highest_committed = max(job.highest_committed, member.committed)
    return actions


def phase_done(job: JobState, member: Member, phase: str, body: dict[str, Any], now: float) -> None:
    """``member`` completed ``phase`` of the recovery in progress (timed by its own clock)."""
    current = job.recovery.current
    if current is None or member.slot is None:
        raise ProtocolError(f"{member.process} holds no slot in a recovery")
    current.phases.setdefault(phase, {})[member.slot] = {
        "t": float(body.get("t", now)),
        **{k: body[k] for k in ("bytes", "seconds") if k in body},
    }


def _on_phase(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    current = job.recovery.current
    if current is None or current.plan is None:
        raise ProtocolError("phase report outside of a recovery")
    phase_done(job, member, str(body["phase"]), body, now)
    return []


def _on_done(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    move(member, MemberState.DONE)
    member.committed = int(body["step"])
    job.highest_committed = max(job.highest_committed, member.committed)
    if job.recovery.failed or job.recovery.current is not None:
        return []
    return finish_if_all_done(job)


def _on_error(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    member.error = {"step": body.get("step"), "traceback": str(body.get("traceback", ""))}
    return []


def _on_chaos_fired(
    job: JobState, member: Member, body: dict[str, Any], now: float
) -> list[Action]:
    event = job.chaos_pending.pop(int(body["id"]), None)
    if event is None:
        return []
    return [record("chaos_fired", process=member.process, **event.to_dict())]


def _on_warning(job: JobState, member: Member, body: dict[str, Any], now: float) -> list[Action]:
    # A worker's finding about the user's state (see runtime/replicas.py): kept, not acted on.
    objects = body.get("objects")
    warning = record(
        "warning",
        process=member.process,
        slot=member.slot,
        step=body.get("step"),
        what=str(body.get("what", ""))[:64],
        objects=[str(o)[:64] for o in objects][:32] if isinstance(objects, list) else [],
        message=str(body.get("message", ""))[:2000],
    )
    return [warning]


HANDLERS: dict[str, Handler] = {
    "max_steps": _on_max_steps,
    "progress": _on_progress,
    "ready": _on_ready,
    "halted": _on_halted,
    "phase": _on_phase,
    "done": _on_done,
    "error": _on_error,
    "chaos_fired": _on_chaos_fired,
    "warning": _on_warning,
}


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)
