"""Joins and reports: the transitions a process's own messages cause.

Pure functions over :class:`JobState` (``now`` is passed in): each changes the state in place
and returns the actions that carry the change out. A refused report raises
:class:`~torchrelay.control.actions.Refused` (with the ledger line to write first) or a
:class:`~torchrelay.control.errors.ProtocolError`; the state is then left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control import drills, handover
from torchrelay.control.actions import Action, Record, Refused, Send, StartRecovery
from torchrelay.control.claims import claimed_step, judge_claim, judge_max_steps
from torchrelay.control.endings import FINISH, finish_if_all_done
from torchrelay.control.errors import FencedError, ProtocolError
from torchrelay.control.protocol import (
    ChaosFired,
    Done,
    ErrorReport,
    Halted,
    JoinRequest,
    MaxSteps,
    PhaseDone,
    Progress,
    Ready,
    Report,
    ToldLate,
    WarningReport,
)
from torchrelay.control.spares import spare_accounted
from torchrelay.control.state import GONE, JobPhase, JobState, Member, MemberState, Role, move


def join(
    job: JobState,
    config: JobConfig,
    process: str,
    request: JoinRequest,
    now: float,
) -> list[Action]:
    """Register a process; workers name their slot (only at job start), spares get one later."""
    slot = request.slot
    member = Member(process, Role(request.role), request.node, request.pid, last_seen=now)
    member.device = request.device
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
        spare_accounted(job, request.node)
    actions: list[Action] = []
    if job.phase is not JobPhase.RUNNING:
        # A refill spare that comes up after the job ended must not wait forever.
        actions.append(Send(process, FINISH))
    joined = events.ProcessJoin(
        process=process, role=request.role, slot=slot, pid=request.pid, node=request.node
    )
    return [*actions, Record(joined)]


Handler = Callable[[JobState, Member, Any, float], list[Action]]


def report(job: JobState, process: str, message: Report, now: float) -> list[Action]:
    """Handle one report from a process.

    Every report is fenced: one from a dead, fenced or superseded member is refused with a
    :class:`FencedError`. A step claim that does not fit the plan (see
    :mod:`torchrelay.control.claims`) is refused with a :class:`ProtocolError`, as is a
    ``max_steps`` that differs from the job's; both refusals are recorded in the ledger.
    """
    handler = HANDLERS[type(message)]
    member = job.member(process)
    _check_fence(job, member, message)
    if member.state is MemberState.RETIRED:
        return []  # its slot runs elsewhere now: what it still says changes nothing
    _check_claim(job, member, message)
    member.last_seen = now
    return handler(job, member, message, now)


def wakes(message: Report, actions: list[Action]) -> bool:
    """Whether handling ``message``, which decided ``actions``, may change what one of the
    controller's waiters waits for. A heartbeat that decided nothing does not: the recovery
    coordinator waits for halts, phases, spares and exits; the monitor for its next tick, by
    the clock (it reads the heartbeats then); the launcher for the job's end.

    Every process heartbeats twice a second. Waking the waiters on each heartbeat cost each a
    thread switch under the lock, and, during a recovery, the coordinator a look over every
    survivor: O(ranks) per heartbeat, O(ranks^2) a second.
    """
    return bool(actions) or not isinstance(message, Progress) or message.first_after_recovery


def _check_fence(job: JobState, member: Member, message: Report) -> None:
    generation = member.generation if message.generation is None else message.generation
    stale = member.state in GONE or (
        member.role is Role.WORKER
        and generation < job.generation
        and member.generation < job.generation
    )
    if stale:
        refused = events.FencedRefused(
            process=member.process,
            slot=member.slot,
            generation=generation,
            current_generation=job.generation,
        )
        error = FencedError(
            f"process {member.process} (slot {member.slot}, generation {generation}) was "
            f"fenced out; the job is at generation {job.generation}"
        )
        raise Refused(error, [Record(refused)])


def _check_claim(job: JobState, member: Member, message: Report) -> None:
    claim = claimed_step(message)
    if claim is None:
        return
    channel, step = claim
    # A report of an older generation still in flight is checked against the plan only.
    current = message.generation == member.generation
    floor = member.claims.get(channel) if current else None
    reason = judge_claim(message.TAG, step, job.max_steps, floor)
    if reason is not None:
        _refuse(member, message.TAG, reason)
    if current:
        member.claims[channel] = max(step, -1 if floor is None else floor)


def _refuse(member: Member, kind: str, reason: str) -> None:
    refused = events.ClaimRefused(process=member.process, kind=kind, reason=reason)
    raise Refused(ProtocolError(f"{member.process}: {reason}"), [Record(refused)])


def _on_max_steps(job: JobState, member: Member, message: MaxSteps, now: float) -> list[Action]:
    reason = judge_max_steps(message.max_steps, job.max_steps)
    if reason is not None:
        _refuse(member, "max_steps", reason)
    job.max_steps = message.max_steps
    return []


def _on_progress(job: JobState, member: Member, message: Progress, now: float) -> list[Action]:
    for key in ("step_seconds", "compute_seconds"):
        seconds = getattr(message, key)
        if seconds is not None:
            member.timings[key] = seconds
    if not message.first_after_recovery:  # a heartbeat: what the worker is doing now
        member.step_age = message.step_age
        member.waiting = message.waiting
        member.busy = message.busy is not None
    step = message.step
    member.committed = max(member.committed, step)
    actions: list[Action] = []
    if step > job.highest_committed:
        job.highest_committed = step
        actions += drills.fire_node_chaos(job)
    current = job.recovery.current
    if (
        message.first_after_recovery
        and current is not None
        and current.plan is not None
        and message.generation == current.plan.generation
    ):
        phase_done(job, member, "first_step", now if message.t is None else message.t)
    return actions


def _on_ready(job: JobState, member: Member, message: Ready, now: float) -> list[Action]:
    if member.role is not Role.SPARE or member.state is not MemberState.STARTING:
        raise ProtocolError(f"{member.process} reported ready but is {member.state.value}")
    move(member, MemberState.READY)
    spare_ready = events.SpareReady(
        process=member.process, cpu_seconds=message.cpu_seconds, forked=message.forked
    )
    ready: list[Action] = [Record(spare_ready)]
    # An --elastic job that runs shrunk grows back onto it (control.elastic.want_grow).
    return [*ready, StartRecovery()] if job.hosted else ready


def _on_halted(job: JobState, member: Member, message: Halted, now: float) -> list[Action]:
    move(member, MemberState.HALTED)
    member.committed = message.committed
    if message.last_commit_t is not None:
        member.last_commit_t = message.last_commit_t
    member.valid = message.valid is not False
    recovery, actions = job.recovery, []
    current = recovery.current
    plan = current.plan if current is not None else None
    if plan is not None and message.generation == plan.generation:
        # A member could not complete the published plan (its transfer failed or was
        # aborted): plan again with what is alive.
        recovery.replan = message.reason or "a member could not enter the generation"
        failed = events.RecoveryFailed(
            process=member.process,
            slot=member.slot,
            generation=plan.generation,
            reason=recovery.replan,
        )
        actions.append(Record(failed))
    if current is not None and message.in_flight is not None:
        current.in_flight.add(message.in_flight)
    job.highest_committed = max(job.highest_committed, member.committed)
    return actions


def phase_done(job: JobState, member: Member, phase: str, t: float, **sizes: float | None) -> None:
    """``member`` completed ``phase`` of the recovery in progress at ``t`` (its own clock);
    ``sizes``: what it moved (``bytes``, ``seconds``), where known."""
    current = job.recovery.current
    if current is None or member.slot is None:
        raise ProtocolError(f"{member.process} holds no slot in a recovery")
    current.phases.setdefault(phase, {})[member.slot] = {
        "t": t,
        **{k: v for k, v in sizes.items() if v is not None},
    }


def _on_phase(job: JobState, member: Member, message: PhaseDone, now: float) -> list[Action]:
    current = job.recovery.current
    plan = current.plan if current is not None else None
    if plan is None or message.generation != plan.generation:
        # Late: its plan was superseded or aborted while the report was on its way (a
        # member died mid-transfer). Nothing to record, and no reason to refuse it: the
        # sender is a healthy member that the next plan counts on.
        return []
    t = now if message.t is None else message.t
    phase_done(job, member, message.phase, t, bytes=message.bytes, seconds=message.seconds)
    return []


def _on_told_late(job: JobState, member: Member, message: ToldLate, now: float) -> list[Action]:
    return handover.told_late(job, member, message.step)


def _on_done(job: JobState, member: Member, message: Done, now: float) -> list[Action]:
    if member.state is MemberState.FENCING:
        # Judged hung, it is being killed: its kill is on the way (the stack dump before it
        # can even wake a hung call), so its slot is recovered from its exit. Taken as done,
        # the kill would land after the job's end and fail it ("after its last step").
        return []
    move(member, MemberState.DONE)
    member.committed = message.step
    job.highest_committed = max(job.highest_committed, member.committed)
    if job.recovery.failed or job.recovery.current is not None:
        return []
    return finish_if_all_done(job)


def _on_error(job: JobState, member: Member, message: ErrorReport, now: float) -> list[Action]:
    member.error = {"step": message.step, "traceback": message.traceback}
    if message.step is not None:
        # Failing in step N, it committed N - 1, whether or not a heartbeat said so yet: the
        # bug-or-hardware verdict on its exit must not depend on heartbeat timing.
        member.committed = max(member.committed, message.step - 1)
        job.highest_committed = max(job.highest_committed, member.committed)
    return []


def _on_chaos_fired(job: JobState, member: Member, message: ChaosFired, now: float) -> list[Action]:
    event = job.chaos_pending.pop(message.id, None)
    if event is None:
        return []
    return [Record(events.ChaosFired.of(member.process, event))]


def _on_warning(job: JobState, member: Member, message: WarningReport, now: float) -> list[Action]:
    # A worker's finding about the user's state (see runtime/replicas.py): kept, not acted on.
    warning = events.WarningEvent(
        process=member.process,
        slot=member.slot,
        step=message.step,
        what=message.what[:64],
        objects=tuple(o[:64] for o in message.objects[:32]),
        message=message.message[:2000],
    )
    return [Record(warning)]


HANDLERS: dict[type[Report], Handler] = {
    MaxSteps: _on_max_steps,
    Progress: _on_progress,
    Ready: _on_ready,
    Halted: _on_halted,
    PhaseDone: _on_phase,
    ToldLate: _on_told_late,
    Done: _on_done,
    ErrorReport: _on_error,
    ChaosFired: _on_chaos_fired,
    WarningReport: _on_warning,
}
