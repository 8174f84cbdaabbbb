"""Transparent mode's recovery decisions: a dead slot is rebuilt by cloning a live replica.

A ``--transparent`` job keeps no spare: its workers' live state includes the script's Python
frames, which only a process copy carries. When slots fail, :func:`clone_for` picks a donor
for each (a survivor on the controller's own node, whose agent makes the copy), tells it to
park (:class:`Park`: at its voided step's boundary, every socket closed) and asks the agent to
copy it (:class:`CloneReplica`). The copy counts as a spare on its way; it joins as a spare and
the ordinary recovery (:mod:`recovery_steps`) hands it the dead slot: the state transfer then
carries only the step number, since the copy holds the donor's whole state.

:func:`copied` takes the agent's outcome: a :class:`ReplicaCloned` is kept for the round's
``recovery_done`` (bytes moved, the copy's timeline); a :class:`CopyFailed` means no spare is
coming, so the recovery ends the job with the reason.

A drain (:mod:`handover`) needs no spare either: at the boundary, :func:`migrations` tells each
drained worker to park and the agent to move it (:class:`MigrateWorker`: dump, CRIU kills the
original, restore under the same name; a copy moves like an original); the plan then re-forms
the same members in a new generation, and nothing is redone. Pure functions over the job's state.
"""

from __future__ import annotations

from torchrelay.config import JobConfig
from torchrelay.control.actions import Action, CloneReplica, MigrateWorker, Record, Send
from torchrelay.control.endings import fail
from torchrelay.control.plan_publish import next_step
from torchrelay.control.protocol import Park
from torchrelay.control.spares import spare_accounted
from torchrelay.control.state import JobState, Member, MemberState, RecoveryStep, Round
from torchrelay.event_base import Event
from torchrelay.events_criu import CopyFailed, ReplicaCloned, WorkerMigrated


def donors(job: JobState, survivors: list[Member], needed: int) -> list[Member]:
    """Up to ``needed`` donors, one per failed slot: live survivors on the controller's node,
    highest slot first (rank 0 is the one a script most often treats specially). A copy made
    by an earlier recovery is a donor like any (it runs in a PID namespace of its own, which
    CRIU dumps with it: :mod:`torchrelay.transparent.nsinit`)."""
    local = [m for m in survivors if m.node == job.local_node and m.state is not MemberState.DEAD]
    local.sort(key=lambda m: -(m.slot or 0))
    return [local[i % len(local)] for i in range(needed)] if local else []


def clone_for(job: JobState, slots: list[int], survivors: list[Member], now: float) -> list[Action]:
    """Order one clone per failed slot (none if no donor is on this node: the recovery then
    finds no spare coming and says why)."""
    assert job.local_node is not None
    actions: list[Action] = []
    for slot, donor in zip(slots, donors(job, survivors, len(slots)), strict=False):
        job.spares_launching[job.local_node] = job.spares_launching.get(job.local_node, 0) + 1
        actions += [
            Send(donor.process, Park(generation=job.generation)),
            CloneReplica(donor.process, slot, job.generation, now),
        ]
    return actions


def migrations(
    job: JobState, config: JobConfig, current: Round, now: float, actions: list[Action]
) -> float | None:
    """A drain at its boundary (every rank halted): move each drained worker into a copy of
    itself. Returns when to look again, or ``None`` once every move is over (moved, or left
    where it was after a failed dump): the plan then re-forms the same members."""
    assert current.handover is not None
    handover = current.handover
    if "moves" not in handover:
        handover["moves"] = {}
        current.halted = now  # the stall is counted from the boundary
        for slot, wanted in handover["requests"].items():
            park = Park(generation=job.generation)
            move_it = MigrateWorker(wanted["process"], int(slot), job.generation, now)
            actions += [Send(wanted["process"], park), move_it]
        next_step(current, RecoveryStep.HALT, now, config.halt_timeout)
        return current.deadline
    if len(handover["moves"]) == len(handover["requests"]):
        return None
    if now < current.deadline:
        return current.deadline
    actions += fail(
        job, f"the migration of slot(s) {current.slots} took more than {config.halt_timeout} s"
    )
    return None


def copied(job: JobState, event: Event) -> list[Action]:
    """The agent's outcome of a :class:`CloneReplica` or a :class:`MigrateWorker`."""
    current = job.recovery.current
    if isinstance(event, ReplicaCloned | WorkerMigrated) and current is not None:
        current.copies.append(event.to_json())
    if isinstance(event, CopyFailed) and event.kind == "clone" and job.local_node is not None:
        spare_accounted(job, job.local_node)  # no spare comes of it
    moved = isinstance(event, WorkerMigrated) or (
        isinstance(event, CopyFailed) and event.kind == "migrate"
    )
    if moved and current is not None and current.handover is not None:
        current.handover.setdefault("moves", {})[event.process] = event.TAG  # type: ignore[attr-defined]
    return [Record(event)]
