"""Elastic shrink and regrow (``torchrelay run --elastic``): pure decisions over the job state.

The logical world keeps its ``N`` slots for the whole job: ``dist.get_world_size()``, the data
order (``(seed, epoch, step, rank)``), the RNG streams and DDP's division of the gradients by
``N`` never change. What changes is how many processes run them:

- **shrink**: a slot lost with no spare ready, starting or launching (a crash's recovery, see
  :mod:`torchrelay.control.recovery_steps`), or released by an operator or a pool at a step
  boundary (:func:`release`, carried out as a planned handover): the slot becomes *hosted* by
  a survivor (:func:`choose_hosts`: the least loaded, several orphans spread). The host runs the
  hosted slot's micro-batch in an accumulating pass before its own (see
  :mod:`torchrelay.runtime.hosting`), so the step's sum of gradients is the same. The next
  generation's process group has one member per slot that has a process of its own; the plan
  carries ``hosted`` to every member. ``job_shrunk`` names the hosts.
- **regrow**: once a spare is ready and nothing else is under way, each hosted slot it can fill
  is handed to it at a step boundary (:func:`want_grow`: a handover whose source is every
  replica and whose old holder stays, hosting one slot less); ``job_grown``.

``JobState.hosted`` maps a virtual slot to the *slot* of its host (not the process), so a host
that dies and is replaced by a spare hands its hosted slots to the spare with its own, and a
host that dies with no spare orphans them too: they are hosted again by the survivors.

Refused: a shrink below ``--min-nproc`` processes (the job then stops with the reason as without
``--elastic``), a release on a job without ``--elastic``, of a slot that has no process of its
own, or while another handover is pending.
"""

from __future__ import annotations

from typing import Any

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control.actions import Action, Record, Send, StartRecovery
from torchrelay.control.endings import fail
from torchrelay.control.errors import ProtocolError
from torchrelay.control.parking import PARK
from torchrelay.control.plan_publish import announce
from torchrelay.control.planner import NO_LIVE_REPLICA, PlanningError, plan_recovery
from torchrelay.control.protocol import Retire
from torchrelay.control.spares import in_sight, ready_spares, start_spare
from torchrelay.control.state import GONE, JobPhase, JobState, Member, MemberState, Round, move

RELEASE = "release"
"""The ``kind`` of a handover request that gives a slot up to a survivor (no spare)."""
GROW = "grow"
"""The ``kind`` of a handover request that moves a hosted slot to a spare (no retirement)."""


def choose_hosts(orphans: list[int], load: dict[int, int]) -> dict[int, int]:
    """Give each orphaned slot a host among the slots in ``load`` (slot -> how many slots it
    hosts already): the least loaded, ties to the lowest slot, so several orphans spread.
    Raises :class:`PlanningError` when no slot is left to host them."""
    if not load:
        raise PlanningError(f"{NO_LIVE_REPLICA}: no process is left to host slot(s) {orphans}")
    load = dict(load)
    chosen: dict[int, int] = {}
    for orphan in sorted(orphans):
        host = min(load, key=lambda slot: (load[slot], slot))
        chosen[orphan] = host
        load[host] += 1
    return chosen


def shrink_refusal(processes: int, lost: int, min_nproc: int) -> str | None:
    """Why a job of ``processes`` processes may not lose ``lost`` of them (``None``: it may)."""
    left = processes - lost
    if left < max(1, min_nproc):
        return (
            f"--elastic: shrinking to {left} process(es) would go below --min-nproc "
            f"{max(1, min_nproc)}"
        )
    return None


def orphans(job: JobState, lost: list[int]) -> list[int]:
    """The slots left without a process when ``lost`` slots lose theirs: those and the slots
    they hosted."""
    return sorted(set(lost) | {v for v, host in job.hosted.items() if host in lost})


def holder(job: JobState, slot: int) -> str | None:
    """The process that runs ``slot``'s micro-batches: its own or its host's."""
    own = job.assignments.get(slot)
    if own is not None:
        return own
    host = job.hosted.get(slot)
    return None if host is None else job.assignments.get(host)


def publish_shrink(
    job: JobState,
    config: JobConfig,
    current: Round,
    now: float,
    survivors: list[Member],
    reason: str,
) -> list[Action]:
    """The next generation without the processes of ``current.slots``: their slots (and the
    slots they hosted) are hosted by ``survivors``; sources as in a recovery (survivors at the
    highest valid committed step), laggards receive."""
    lost = list(current.slots)
    orphaned = orphans(job, lost)
    staying = [m for m in survivors if m.slot is not None and m.slot not in lost]
    kept = {v: h for v, h in job.hosted.items() if v not in orphaned}
    load = {m.slot: sum(1 for h in kept.values() if h == m.slot) for m in staying}
    try:
        hosts = choose_hosts(orphaned, load)  # type: ignore[arg-type]
        plan = plan_recovery(
            job.generation,
            {s: p for s, p in job.assignments.items() if s not in lost},
            {},
            {m.slot: m.committed for m in staying},  # type: ignore[misc]
            job.highest_committed,
            frozenset(m.slot for m in staying if not m.valid),  # type: ignore[misc]
        )
    except PlanningError as exc:
        return fail(job, str(exc))
    job.hosted = {**kept, **hosts}
    actions = announce(job, config, current, now, plan)
    shrunk = events.JobShrunk(
        generation=plan.generation,
        slots=tuple(lost),
        hosts={str(v): h for v, h in sorted(job.hosted.items())},
        processes=len(plan.assignments),
        target_step=plan.target_step,
        reason=reason,
    )
    return [*actions, Record(shrunk)]


def release(job: JobState, config: JobConfig, slot: int, now: float) -> list[Action]:
    """Ask for ``slot``'s process to leave at the next step boundary, its slot hosted by a
    survivor (a pool taking a slot back, or ``torchrelay shrink``); :class:`ProtocolError`
    (one line) when that is refused (see the module doc)."""
    if not config.elastic:
        raise ProtocolError("the job was not started with --elastic: it cannot shrink")
    if job.phase is not JobPhase.RUNNING:
        raise ProtocolError("the job is not running: nothing to release")
    member = job.by_slot().get(slot)
    if member is None or member.state in GONE:
        raise ProtocolError(f"slot {slot} has no process of its own to release")
    if job.recovery.handovers or job.recovery.current is not None:
        raise ProtocolError("a recovery or handover is under way: release the slot after it")
    refusal = shrink_refusal(len(job.assignments), 1, config.min_nproc)
    if refusal is not None:
        raise ProtocolError(refusal)
    job.recovery.handovers[slot] = {
        "process": member.process,
        "reason": f"slot {slot} released",
        "since": now,
        "trigger": None,
        "kind": RELEASE,
    }
    asked = events.HandoverRequested(
        slots=(slot,), processes=(member.process,), reason=f"release of slot {slot}", since=now
    )
    return [Record(asked), StartRecovery()]


def want_grow(job: JobState, config: JobConfig, now: float) -> list[Action]:
    """Ask for the hosted slots that ready spares can fill to move to them (nothing else
    under way: called when no recovery or handover is pending)."""
    if not config.elastic or job.phase is not JobPhase.RUNNING or job.recovery.current is not None:
        return []
    spares = len(ready_spares(job))
    moving = sorted(job.hosted)[:spares]
    for slot in moving:
        job.recovery.handovers[slot] = {
            "process": holder(job, slot),
            "reason": f"hosted slot {slot} regrows on a spare",
            "since": now,
            "trigger": None,
            "kind": GROW,
        }
    if not moving:
        return []
    asked = events.HandoverRequested(
        slots=tuple(moving),
        processes=tuple(str(holder(job, s)) for s in moving),
        reason="regrow",
        since=now,
    )
    return [Record(asked)]


def needs_spare(request: dict[str, Any]) -> bool:
    """Whether a handover request moves its slot to a spare (a release or a park does not)."""
    return request.get("kind") not in (RELEASE, PARK)


def publish_release(
    job: JobState, config: JobConfig, current: Round, now: float, survivors: list[Member]
) -> list[Action]:
    """A release's plan: the released processes retire, survivors host their slots."""
    assert current.handover is not None
    moving = {int(s): r["process"] for s, r in current.handover["requests"].items()}
    reason = "; ".join(sorted(r["reason"] for r in current.handover["requests"].values()))
    actions = publish_shrink(job, config, current, now, survivors, reason)
    if job.finished:
        return actions
    for process in moving.values():
        move(job.members[process], MemberState.RETIRED)
        actions.append(Send(process, Retire()))
    current.handover["retired"] = sorted(moving.values())
    return actions


def grown(job: JobState, current: Round) -> list[Action]:
    """``job_grown`` for the regrown slots of a handover's published plan."""
    assert current.handover is not None and current.plan is not None
    slots = [int(s) for s, r in current.handover["requests"].items() if r.get("kind") == GROW]
    if not slots or job.finished:
        return []
    plan = current.plan
    regrown = events.JobGrown(
        generation=plan.generation,
        slots=tuple(sorted(slots)),
        processes={str(s): plan.assignments[s] for s in sorted(slots)},
        hosts={str(v): h for v, h in sorted(job.hosted.items())},
        target_step=plan.target_step,
    )
    return [Record(regrown)]


def add_spare(job: JobState) -> tuple[list[Action], int]:
    """Start one spare more (an operator's ``torchrelay grow``, later a pool lending a slot);
    returns the actions and the spares then in sight."""
    if job.phase is not JobPhase.RUNNING:
        raise ProtocolError("the job is not running: no spare is started")
    actions = start_spare(job)
    return actions, sum(in_sight(job))
