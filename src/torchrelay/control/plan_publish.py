"""Publishing the next generation's plan: the step a recovery and a planned handover share.

Pure, like the transitions that call it: it changes the :class:`JobState` in place (the new
generation, its assignments, every member of it ``ACTIVE``) and returns the plan messages, the
``recovery_planned`` event, and a ``seated`` notice to each other node whose spare took a slot.
"""

from __future__ import annotations

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control.actions import Action, Record, Send, SendToNode
from torchrelay.control.drills import chaos_for
from torchrelay.control.endings import fail
from torchrelay.control.planner import (
    PlanningError,
    RecoveryPlan,
    Spare,
    choose_replacements,
    plan_recovery,
)
from torchrelay.control.protocol import Plan, Seated
from torchrelay.control.slot_runs import runs
from torchrelay.control.spares import ready_spares
from torchrelay.control.state import (
    JobState,
    Member,
    MemberState,
    RecoveryStep,
    Role,
    Round,
    move,
)
from torchrelay.control.verdicts import recovery_deadline


def next_step(current: Round, step: RecoveryStep, now: float, limit: float) -> None:
    """Move ``current`` to ``step``, begun at ``now`` and allowed ``limit`` seconds."""
    current.step, current.step_since, current.step_limit = step, now, limit


def publish_plan(
    job: JobState,
    config: JobConfig,
    current: Round,
    now: float,
    replaced: dict[int, str],
    survivors: list[Member],
) -> list[Action]:
    """Plan the next generation: ``replaced`` slots (slot -> the node they ran on) get ready
    spares, the ``survivors`` at the highest valid committed step are the sources; send each
    member its plan. A recovery's and a handover's plan alike."""
    spares = [Spare(m.process, m.node) for m in ready_spares(job)]
    nodes = {m.slot: m.node for m in job.slot_members() if m.slot is not None}
    try:
        replacements = choose_replacements(replaced, spares, nodes)
        plan = plan_recovery(
            job.generation,
            job.assignments,
            replacements,
            {m.slot: m.committed for m in survivors},  # type: ignore[misc]
            job.highest_committed,
            frozenset(m.slot for m in survivors if not m.valid),  # type: ignore[misc]
        )
    except PlanningError as exc:
        return fail(job, str(exc))
    return announce(job, config, current, now, plan)


def announce(
    job: JobState, config: JobConfig, current: Round, now: float, plan: RecoveryPlan
) -> list[Action]:
    """Make ``plan`` the job's next generation and send each member its part (with the
    job's hosted slots, see :mod:`torchrelay.control.elastic`)."""
    current.plan, current.planned = plan, now
    # Never a silent wait: a plan not carried out in time is abandoned and re-planned.
    limit = recovery_deadline(config.halt_timeout, job.hang_timeout)
    next_step(current, RecoveryStep.DONE, now, limit)
    job.generation = plan.generation
    job.assignments = dict(plan.assignments)
    for slot in plan.replaced:
        job.hosted.pop(slot, None)  # a regrown slot runs on its own process again
    job.recovery.failed.clear()
    # The same runs for every member: O(failed slots) each, not O(ranks).
    members, sources = runs(plan.assignments), runs(plan.sources)
    actions: list[Action] = []
    for slot, process in plan.assignments.items():
        member = job.members[process]
        move(member, MemberState.ACTIVE)
        if member.role is Role.SPARE and member.slot != slot and member.node != job.local_node:
            actions.append(SendToNode(member.node, Seated(process=process, slot=slot)))
        member.slot, member.generation = slot, plan.generation
        if slot in plan.receivers:
            member.claims.clear()  # its state is replaced: back to the target step
        # A fresh start for the detector: the old step's progress means nothing now.
        member.last_seen, member.step_age, member.waiting = now, None, None
        message = Plan(
            generation=plan.generation,
            target_step=plan.target_step,
            sources=sources,
            receivers=tuple(plan.receivers),
            members=members,
            slot=slot,
            chaos=tuple(chaos_for(job, slot)),
            store=job.store or None,
            hosted={str(v): h for v, h in job.hosted.items()} or None,
        )
        actions.append(Send(process, message))
    planned = events.RecoveryPlanned(
        generation=plan.generation,
        target_step=plan.target_step,
        sources=tuple(plan.sources),
        receivers=tuple(plan.receivers),
        replaced={str(k): v for k, v in plan.replaced.items()},
        lost_steps=plan.lost_steps,
    )
    return [*actions, Record(planned)]
