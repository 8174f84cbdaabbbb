"""The recovery's decisions, one step at a time, as a pure function of the job's state.

A recovery (a :class:`~torchrelay.control.state.Round`) goes through
:class:`~torchrelay.control.state.RecoveryStep`:

1. start: abort the survivors, kill the failed processes, ``recovery_start``, top up spares;
2. ``SPARES``: wait until enough spares are ready (``--spare-timeout``); if none can come,
   ``ABANDON``: wait for the survivors' halts (they name the step in flight), then fail -- or,
   with ``--elastic``, a *shrink*: on to ``HALT``, the survivors host the lost slots
   (:mod:`torchrelay.control.elastic`);
3. ``HALT``: wait until every survivor halted (``--halt-timeout``), then publish the plan;
4. ``DONE``: wait until every member committed its first step (``recovery_done``); a plan not
   carried out in time, a member that could not enter it, or a new failure supersede it.

A new failure before the plan supersedes the round too; the next round carries its failures and
steps in flight over. :func:`advance` takes every step that can be decided now and says when to
decide again if nothing changes meanwhile; the coordinator thread waits on the controller's
condition until then.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control import elastic, handover, parking, transparent
from torchrelay.control.actions import Action, Record, Send
from torchrelay.control.endings import fail, finish_if_all_done
from torchrelay.control.nodes import signal as signal_process
from torchrelay.control.plan_publish import next_step, publish_plan
from torchrelay.control.protocol import Abort
from torchrelay.control.spares import none_will_come, ready_spares, top_up
from torchrelay.control.state import JobState, Member, MemberState, RecoveryStep, Round
from torchrelay.control.verdicts import (
    no_spare_reason,
    overdue_reason,
    survivor_gaps,
)


def advance(job: JobState, config: JobConfig, now: float) -> tuple[list[Action], float | None]:
    """Take every recovery step that can be decided at ``now``.

    Returns the actions and when to decide again if nothing changes before (a deadline), or
    ``None`` when no recovery is wanted any more (or the job ended).
    """
    actions: list[Action] = []
    while not job.finished:
        current = job.recovery.current
        if current is None or current.step is RecoveryStep.SUPERSEDED:
            if job.recovery.pending:
                actions += _start(job, config, now)
                continue
            if not job.recovery.handovers:
                actions += elastic.want_grow(job, config, now)
            if not job.recovery.handovers:
                break
            more, wake = handover.begin(job, config, now)
            actions += more
            if job.recovery.current is not current:
                continue  # a handover started
            return actions, wake
        steps = STEPS if current.handover is None else handover.STEPS
        wake = steps[current.step](job, config, current, now, actions)
        if wake is not None:
            return actions, wake
        if parking.parked(job):
            break  # held without a deadline until the pool's unpark (control.parking)
    return actions, None


def _start(job: JobState, config: JobConfig, now: float) -> list[Action]:
    recovery = job.recovery
    failures = dict(recovery.failed)
    if recovery.replan is not None:
        recovery.replans += 1
        if recovery.replans > config.max_restarts:
            return fail(
                job, f"recovery failed {recovery.replans} times in a row; last: {recovery.replan}"
            )
    recovery.replan = None
    reform, recovery.reform = recovery.reform, None
    previous = recovery.current
    # The slots' failures stay in ``failed`` until a plan is published, so an interrupted
    # round already carries them: only what is not among them is carried over.
    new = list(failures.values())
    known = {(f["process"], f["t"]) for f in new}
    carried = [
        f for f in (previous.failures if previous else []) if (f["process"], f["t"]) not in known
    ]
    merged = carried + new
    merged += [reform] if reform is not None else []
    survivors = [m for m in job.slot_members() if m.slot not in failures]
    current = Round(
        merged,
        min((f["t"] for f in merged), default=now),
        slots=sorted(failures),
        survivors=[m.process for m in survivors],
        step_since=now,
        step_limit=config.spare_timeout,
    )
    if previous is not None:
        current.in_flight = set(previous.in_flight)
    recovery.current = current
    abort = Abort(generation=job.generation)
    actions: list[Action] = [Send(m.process, abort) for m in survivors]
    for failure in failures.values():
        actions += signal_process(job, failure["process"], signal.SIGKILL)
    started = events.RecoveryStart(
        generation=job.generation, slots=tuple(current.slots), t=current.detected
    )
    actions.append(Record(started))
    if config.transparent:  # no spare: clone a live replica (see control.transparent)
        return actions + transparent.clone_for(job, current.slots, survivors, now)
    return actions + top_up(job, config, len(failures))


def _interrupted(job: JobState, current: Round) -> bool:
    """A failure came in after the round started: start over with all of them."""
    return sorted(job.recovery.failed) != current.slots


def _halted(job: JobState, current: Round) -> list[Member]:
    """The survivors that have not halted yet."""
    survivors = [job.members[p] for p in current.survivors]
    return [m for m in survivors if m.state is not MemberState.HALTED]


Step = Callable[[JobState, JobConfig, Round, float, list[Action]], float | None]


def _await_spares(
    job: JobState, config: JobConfig, current: Round, now: float, actions: list[Action]
) -> float | None:
    needed = len(current.slots)
    if _interrupted(job, current):
        current.step = RecoveryStep.SUPERSEDED
    elif len(ready_spares(job)) >= needed:
        current.spare_ready = now
        next_step(current, RecoveryStep.HALT, now, config.halt_timeout)
    elif none_will_come(job, needed):
        # --elastic: the survivors host the lost slots, unless that leaves too few processes.
        current.shrink = config.elastic and _shrink_refusal(job, config, current) is None
        if current.shrink:
            current.spare_ready = now  # the decision to shrink stands for a spare being ready
        after = RecoveryStep.HALT if current.shrink else RecoveryStep.ABANDON
        next_step(current, after, now, config.halt_timeout)
    elif now >= current.deadline:
        actions += fail(
            job,
            f"no spare became ready within {config.spare_timeout:.0f} s to replace "
            f"slot(s) {current.slots} (started with --spares {config.spares}); "
            "raise --spares or --spare-timeout",
        )
    else:
        return current.deadline
    return None


def _await_halt(
    job: JobState, config: JobConfig, current: Round, now: float, actions: list[Action]
) -> float | None:
    stuck = _halted(job, current)
    if _interrupted(job, current):
        current.step = RecoveryStep.SUPERSEDED
    elif not stuck:
        current.halted = now
        actions += _publish_plan(job, config, current, now)
    elif now >= current.deadline:
        # Their stacks (in their logs) say where they are stuck: fenced with a dump first.
        for member in stuck:
            actions += signal_process(job, member.process, signal.SIGKILL, stacks=True)
        reason = (
            f"survivor slot(s) {sorted(m.slot for m in stuck)} did not stop their step within "  # type: ignore[type-var]
            f"{config.halt_timeout:.0f} s after the failure (their logs end with their stacks)"
        )
        if job.highest_committed < 0:
            reason += (
                "; nothing was committed yet, so they were most likely still setting up (a "
                "survivor halts only at its first step): raise --halt-timeout for a long set-up"
            )
        actions += fail(job, reason)
    else:
        return current.deadline
    return None


def _abandon(
    job: JobState, config: JobConfig, current: Round, now: float, actions: list[Action]
) -> float | None:
    """No spare can replace the failed slots: stop now, naming the step in flight. The
    survivors' halted reports (they were aborted, they stop within milliseconds) tell the
    last step committed exactly; heartbeats alone lag behind."""
    waiting = not _interrupted(job, current) and _halted(job, current)
    if waiting and now < current.deadline:
        return current.deadline
    step = job.highest_committed + 1
    causes = {slot: str(job.recovery.failed[slot]["cause"]) for slot in current.slots}
    reason = no_spare_reason(causes, step, config.spares, config.transparent)
    refusal = _shrink_refusal(job, config, current) if config.elastic else None
    reason += "" if refusal is None else f"; {refusal}"
    abandoned = events.RecoveryAbandoned(slots=tuple(current.slots), step=step, reason=reason)
    actions.append(Record(abandoned))
    actions += fail(job, reason)
    return None


def _shrink_refusal(job: JobState, config: JobConfig, current: Round) -> str | None:
    return elastic.shrink_refusal(len(job.assignments), len(current.slots), config.min_nproc)


def _publish_plan(job: JobState, config: JobConfig, current: Round, now: float) -> list[Action]:
    failures = {slot: job.recovery.failed[slot] for slot in current.slots}
    survivors = [job.members[p] for p in current.survivors]
    if current.shrink:
        causes = "; ".join(f"rank {s}: {f['cause']}" for s, f in sorted(failures.items()))
        return elastic.publish_shrink(job, config, current, now, survivors, causes)
    replaced = {slot: job.members[f["process"]].node for slot, f in failures.items()}
    return publish_plan(job, config, current, now, replaced, survivors)


def _await_done(
    job: JobState, config: JobConfig, current: Round, now: float, actions: list[Action]
) -> float | None:
    plan, recovery = current.plan, job.recovery
    assert plan is not None
    started = set(current.phases.get("first_step", {}))
    settled = (
        bool(recovery.failed) or recovery.replan is not None or set(plan.assignments) <= started
    )
    if not settled and now < current.deadline:
        return current.deadline
    if not settled:
        phases = {phase: set(done) for phase, done in current.phases.items()}
        recovery.replan = overdue_reason(
            plan.generation, current.step_limit, plan.assignments, phases
        )
        late = events.RecoveryFailed(generation=plan.generation, reason=recovery.replan)
        actions.append(Record(late))
    if recovery.failed or recovery.replan is not None:
        # One recovery covers every failure until the job runs again.
        actions.append(Record(events.RecoverySuperseded(generation=plan.generation)))
        current.step = RecoveryStep.SUPERSEDED
        return None
    recovery.replans = 0
    actions.append(_recovery_done(job, current))
    recovery.current = None
    finished = finish_if_all_done(job)
    # The spares this round used are replaced only now: a refill started with the plan would
    # take CPU from the communicator, the transfer and the first step (~0.1 s of it, forked
    # from the template; seconds, started fresh). A failure meanwhile starts what it needs.
    actions += finished or top_up(job, config, 0)
    return None


def _recovery_done(job: JobState, current: Round) -> Action:
    plan = current.plan
    assert plan is not None

    def latest(phase: str) -> float:
        return max(v["t"] for v in current.phases.get(phase, {0: {"t": 0.0}}).values())

    transfers = current.phases.get("transfer_done", {})
    received = sum(int(v.get("bytes", 0)) for s, v in transfers.items() if s in plan.receivers)
    received += sum(int(c["bytes"]) for c in current.copies)  # transparent mode's clones
    timeline = {
        "detected": current.detected,
        "spare_ready": current.spare_ready,
        "halted": current.halted,
        "planned": current.planned,
        "comm_ready": latest("comm_ready"),
        "transfer_done": latest("transfer_done"),
        "first_step": latest("first_step"),
    }
    if current.copies:  # transparent mode's clones
        for phase in ("parked", "dumped", "restored"):
            timeline[phase] = max(float(c[phase]) for c in current.copies)
    last_commits = {
        slot: job.members[process].last_commit_t
        for slot, process in plan.assignments.items()
        if slot not in plan.replaced
    }
    first_commits = {slot: v["t"] for slot, v in current.phases.get("first_step", {}).items()}
    gaps = survivor_gaps(last_commits, first_commits)
    done = events.RecoveryDone(
        generation=plan.generation,
        slots=tuple(sorted(plan.replaced)),
        failures=tuple(current.failures),
        target_step=plan.target_step,
        timeline=timeline,
        recovery_seconds=timeline["first_step"] - timeline["detected"],
        stall_seconds=timeline["first_step"] - min(f["onset"] for f in current.failures),
        # The stall as each survivor saw it, detection included (the above starts later).
        survivor_gap_seconds={str(slot): seconds for slot, seconds in gaps.items()},
        bytes_transferred=received,
        lost_steps=plan.lost_steps,
        recomputed_steps=len({s for s in current.in_flight if s > plan.target_step}),
        sources=tuple(plan.sources),
        receivers=tuple(plan.receivers),
    )
    return Record(done)


STEPS: dict[RecoveryStep, Step] = {
    RecoveryStep.SPARES: _await_spares,
    RecoveryStep.HALT: _await_halt,
    RecoveryStep.ABANDON: _abandon,
    RecoveryStep.DONE: _await_done,
}
