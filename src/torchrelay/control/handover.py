"""Planned handover: move slots to spares at a step boundary, losing and redoing nothing.

One primitive for a drain (``torchrelay drain``) and a health migration: "move slots S from
their processes to spares once every rank has committed step B". Pure functions over
:class:`JobState`, driven by :func:`torchrelay.control.recovery_steps.advance` like a recovery,
as a :class:`Round` whose ``handover`` is set:

1. :func:`request` records the slots (``handover_requested``); a recovery in progress goes
   first, and the request waits for it.
2. :func:`begin`, once a spare is ready for every slot: the boundary is the highest committed
   step plus about :data:`BOUNDARY_SECONDS` of steps (heartbeats lag behind the ranks by up to
   half a second); every rank is told ``handover(generation, B)`` and halts right after
   committing B (``handover_start``). No spare in sight: the request is abandoned
   (``handover_abandoned``), nothing stops.
3. ``HALT``: every rank halted. A rank told too late is in the next step's collective, which
   its halted peers never join: once it says so (``told_late``, see :func:`told_late`) or
   the hang timeout passes, the generation is aborted, the step it had in flight is dropped
   and the plan starts from B all the same. A failure meanwhile supersedes the handover: the
   crash path cures it, and the request is taken up again after.
   Ranks whose training ends before B (they report done; a ``--transparent`` job's length is
   its script's) abandon it (``handover_abandoned``), and the job ends as it would have.
4. The plan (:func:`~torchrelay.control.plan_publish.publish_plan`): spares take the slots,
   sources are the other ranks at B (rank-local state is mirrored to every peer, RNG and data
   follow from ``(seed, step, rank)``, so a replica's copy is exact); the old processes are told
   to ``retire`` (``RETIRED``: they leave with status 0, which is no failure).
5. ``DONE``: every member committed its first step: ``handover_done`` with the lead time (first
   warning to the end), the stall (boundary to first step) and 0 steps recomputed.

A job needs a replica that stays: a handover of every slot at once is refused.

``--elastic`` (see :mod:`torchrelay.control.elastic`) adds two kinds of request: a *release*
needs no spare (its slot is hosted by a survivor and its process retires; a drain waits until
it is done) and a *grow* moves a hosted slot onto a spare (its host keeps its own slot).

A park (:mod:`torchrelay.control.parking`) is a handover of every slot that needs no spare:
the round holds in ``HALT`` until the pool gives the slots back, then re-forms the same members.

A ``--transparent`` job needs no spare: at the boundary each drained worker moves into a CRIU
copy of itself (:func:`torchrelay.control.transparent.migrations`), and the plan re-forms the
same members; nobody retires.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control import elastic, parking, transparent
from torchrelay.control.actions import Action, Record, Send, StartRecovery
from torchrelay.control.endings import fail, finish_if_all_done
from torchrelay.control.errors import ProtocolError
from torchrelay.control.plan_publish import next_step, publish_plan
from torchrelay.control.protocol import Abort, Handover, Retire
from torchrelay.control.spares import none_will_come, ready_spares, top_up
from torchrelay.control.state import (
    GONE,
    JobPhase,
    JobState,
    Member,
    MemberState,
    RecoveryStep,
    Round,
    move,
)

BOUNDARY_SECONDS = 0.75
"""How far ahead of the last reported step the boundary is set, in the job's step time: the
reports lag the ranks by up to a heartbeat period (0.5 s), and the message takes a little."""
UNTIMED_MARGIN = 5
"""Steps ahead when no step has been timed yet."""


def request(
    job: JobState,
    slots: list[int],
    reason: str,
    since: float,
    now: float,
    trigger: dict[str, Any] | None = None,
) -> list[Action]:
    """Ask for ``slots`` to be handed over (see the module doc); :class:`ProtocolError` (one
    line) for a slot that does not exist or is gone, or if no replica would stay."""
    if job.phase is not JobPhase.RUNNING:
        raise ProtocolError("the job is not running: nothing to hand over")
    by_slot = job.by_slot()
    for slot in slots:
        if slot not in by_slot or by_slot[slot].state in GONE:
            raise ProtocolError(f"slot {slot} has no live process to hand over")
    if not all(elastic.needs_spare(r) for r in job.recovery.handovers.values()):
        raise ProtocolError("a slot is being released (--elastic): ask again after it")
    moving = set(slots) | set(job.recovery.handovers)
    if not set(by_slot) - moving:
        raise ProtocolError(
            "a handover needs a replica that stays to send the state: drain fewer slots"
        )
    new = [slot for slot in sorted(slots) if slot not in job.recovery.handovers]
    if not new:
        return []
    for slot in new:
        job.recovery.handovers[slot] = {
            "process": by_slot[slot].process,
            "reason": reason,
            "since": since,
            "trigger": trigger,
        }
    asked = events.HandoverRequested(
        slots=tuple(new),
        processes=tuple(by_slot[s].process for s in new),
        reason=reason,
        since=since,
        trigger=trigger,
    )
    return [Record(asked), StartRecovery()]


def begin(job: JobState, config: JobConfig, now: float) -> tuple[list[Action], float | None]:
    """Start the requested handover if spares are ready for it; else top them up and say
    when to look again (``None``: nothing to wait for)."""
    requests = job.recovery.handovers
    for slot, wanted in list(requests.items()):
        if elastic.holder(job, slot) != wanted["process"]:
            del requests[slot]  # its process died meanwhile: the crash path took the slot
    if not requests:
        return [], None
    needed = sum(1 for wanted in requests.values() if elastic.needs_spare(wanted))
    boundary = job.highest_committed + _margin(job)
    problem = None
    if job.max_steps is not None and boundary >= job.max_steps - 1:
        problem = "the job ends before a step boundary could be planned"
    elif needed and len(ready_spares(job)) < needed and not config.transparent:  # moves
        if none_will_come(job, needed):
            problem = f"no spare for slot(s) {sorted(requests)} (run with --spares >= {needed})"
        else:
            oldest = min(r.get("requested", now) for r in requests.values())
            for wanted in requests.values():
                wanted.setdefault("requested", now)
            if now - oldest < config.spare_timeout:
                return top_up(job, config, needed), oldest + config.spare_timeout
            problem = f"no spare became ready within {config.spare_timeout:.0f} s"
    if problem is not None:
        abandoned = events.HandoverAbandoned(slots=tuple(sorted(requests)), reason=problem)
        requests.clear()
        return [Record(abandoned)], None
    members = job.slot_members()
    job.recovery.current = Round(
        [],
        now,
        slots=sorted(requests),
        survivors=[m.process for m in members],
        step=RecoveryStep.HALT,
        step_since=now,
        step_limit=job.hang_timeout,
        handover={
            "boundary": boundary,
            "aborted": False,
            "requests": {str(k): v for k, v in requests.items()},
        },
    )
    requests.clear()
    told = Handover(generation=job.generation, step=boundary)
    started = events.HandoverStart(
        slots=tuple(job.recovery.current.slots), generation=job.generation, boundary=boundary
    )
    return [*(Send(m.process, told) for m in members), Record(started)], None


def _margin(job: JobState) -> int:
    timed = [m.timings["step_seconds"] for m in job.slot_members() if "step_seconds" in m.timings]
    if not timed:
        return UNTIMED_MARGIN
    return 2 + math.ceil(BOUNDARY_SECONDS / max(statistics.median(timed), 1e-3))


def _await_boundary(
    job: JobState, config: JobConfig, current: Round, now: float, actions: list[Action]
) -> float | None:
    assert current.handover is not None
    if job.recovery.pending:
        _give_back(job, current)
        current.step = RecoveryStep.SUPERSEDED
        return None
    survivors = [job.members[p] for p in current.survivors]
    ended = [m for m in survivors if m.state is MemberState.DONE]
    if ended and not any(m.state is MemberState.HALTED for m in survivors):
        _abandon_at_the_end(job, current, max(m.committed for m in ended), actions)
        return None
    running = [m for m in survivors if m.state is not MemberState.HALTED]
    if not running:
        if parking.hold(job, current, now, actions):
            return None  # parked: the pool's unpark calls advance again
        if config.transparent:  # the drained workers move first (see control.transparent)
            wake = transparent.migrations(job, config, current, now, actions)
            if wake is not None or job.finished:
                return wake
        current.halted = current.halted or now
        actions += _plan(job, config, current, now, survivors)
        return None
    if now < current.deadline and not _stuck_past_boundary(current, survivors):
        return current.deadline
    if not current.handover["aborted"]:
        # Someone heard of the boundary too late and waits in the next step's collective.
        current.handover["aborted"] = True
        actions += [Send(m.process, Abort(generation=job.generation)) for m in running]
        next_step(current, RecoveryStep.HALT, now, config.halt_timeout)
        return current.deadline
    actions += fail(
        job,
        f"slot(s) {sorted(m.slot for m in running)} did not stop at the handover "  # type: ignore[type-var]
        f"boundary (step {current.handover['boundary']}) nor when aborted",
    )
    return None


def told_late(job: JobState, member: Member, step: int) -> list[Action]:
    """``member`` heard of the boundary only after committing ``step`` (>= it) and going on
    into the next step (``handover_late``); :func:`_await_boundary` aborts it once a peer has
    halted before that step. Outside a handover (it ended meanwhile), or at a step before the
    boundary, this changes nothing."""
    current = job.recovery.current
    handing = current.handover if current is not None else None
    if handing is None or step < handing["boundary"]:
        return []
    handing.setdefault("told_late", {})[member.process] = step
    return [Record(events.HandoverLate(process=member.process, slot=member.slot, step=step))]


def _stuck_past_boundary(current: Round, survivors: list[Member]) -> bool:
    """Whether a rank told too late waits in a step that a halted peer never joins: its
    abort need not wait for the hang timeout. Ranks that were all told late are not stuck:
    they commit that step together and halt after it."""
    assert current.handover is not None
    late: dict[str, int] = current.handover.get("told_late", {})
    halted = [m.committed for m in survivors if m.state is MemberState.HALTED]
    if current.handover["aborted"] or not halted:
        return False
    return any(
        m.state is not MemberState.HALTED and m.process in late and min(halted) <= late[m.process]
        for m in survivors
    )


def _abandon_at_the_end(job: JobState, current: Round, last: int, actions: list[Action]) -> None:
    """The script's training ended at step ``last``, before the boundary: no rank will reach
    it (a ``--transparent`` job's length is the script's, unknown to the controller, so its
    boundary is not refused at :func:`begin`). Nobody halted; the job ends as it would have."""
    assert current.handover is not None
    reason = (
        f"the training ended at step {last}, before the handover's boundary "
        f"(step {current.handover['boundary']})"
    )
    actions.append(Record(events.HandoverAbandoned(slots=tuple(current.slots), reason=reason)))
    job.recovery.current = None
    actions += finish_if_all_done(job)


def _give_back(job: JobState, current: Round) -> None:
    """A failure came first: the handover is asked for again once it is cured."""
    assert current.handover is not None
    for slot, wanted in current.handover["requests"].items():
        job.recovery.handovers.setdefault(int(slot), wanted)


def _plan(
    job: JobState, config: JobConfig, current: Round, now: float, survivors: list[Member]
) -> list[Action]:
    assert current.handover is not None
    requests = {int(s): r for s, r in current.handover["requests"].items()}
    parks = parking.parks(requests)
    if not parks and not any(elastic.needs_spare(r) for r in requests.values()):
        return elastic.publish_release(job, config, current, now, survivors)
    moving = {slot: r["process"] for slot, r in requests.items()}
    if config.transparent or parks:  # every member stays, with its state
        moving = {}
    staying = [m for m in survivors if m.slot not in moving]
    replaced = {slot: job.members[process].node for slot, process in moving.items()}
    actions = publish_plan(job, config, current, now, replaced, staying)
    if job.finished:
        return actions
    # A regrown slot's old holder hosted it: it keeps its own slot.
    leaving = [moving[s] for s in moving if requests[s].get("kind") != elastic.GROW]
    for process in leaving:
        move(job.members[process], MemberState.RETIRED)
        actions.append(Send(process, Retire()))
    current.handover["retired"] = sorted(leaving)
    return actions + elastic.grown(job, current)


def _await_done(
    job: JobState, config: JobConfig, current: Round, now: float, actions: list[Action]
) -> float | None:
    plan, handover = current.plan, current.handover
    assert plan is not None and handover is not None
    started = current.phases.get("first_step", {})
    if job.recovery.pending or job.recovery.replan is not None:
        # A member died while entering it: the crash path takes over from the plan's state.
        actions.append(Record(events.RecoverySuperseded(generation=plan.generation)))
        current.step = RecoveryStep.SUPERSEDED
        return None
    if not set(plan.assignments) <= set(started):
        if now < current.deadline:
            return current.deadline
        job.recovery.replan = f"the handover's plan (generation {plan.generation}) overran"
        current.step = RecoveryStep.SUPERSEDED
        return None
    requests = list(handover["requests"].values())
    first_step = max(v["t"] for v in started.values())
    since = min(r["since"] for r in requests)
    transfers = current.phases.get("transfer_done", {})
    done = events.HandoverDone(
        slots=tuple(current.slots),
        generation=plan.generation,
        target_step=plan.target_step,
        replaced={str(k): v for k, v in plan.replaced.items()},
        retired=tuple(handover.get("retired", ())),
        reason="; ".join(sorted({r["reason"] for r in requests})),
        trigger=next((r["trigger"] for r in requests if r["trigger"] is not None), None),
        since=since,
        lead_seconds=first_step - since,
        stall_seconds=first_step - current.halted,
        recomputed_steps=len({s for s in current.in_flight if s > plan.target_step}),
        lost_steps=plan.lost_steps,
        bytes_transferred=sum(
            int(v.get("bytes", 0)) for s, v in transfers.items() if s in plan.receivers
        )
        + sum(int(c["bytes"]) for c in current.copies),  # transparent mode's moves
    )
    actions.append(Record(done))
    job.recovery.current = None
    actions += finish_if_all_done(job)
    return None


Step = Callable[[JobState, JobConfig, Round, float, list[Action]], float | None]
STEPS: dict[RecoveryStep, Step] = {
    RecoveryStep.HALT: _await_boundary,
    RecoveryStep.DONE: _await_done,
}
