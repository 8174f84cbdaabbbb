"""Transparent mode's recovery decisions: a dead slot is rebuilt by cloning a live replica.

A ``--transparent`` job keeps no spare: its workers' live state includes the script's Python
frames, which only a process copy carries. When slots fail, :func:`clone_for` picks a donor
for each (:func:`donors`: a live survivor on any node), tells it to park (:class:`Park`: at its
voided step's boundary, every socket closed) and asks the donor's node agent to copy it: the
controller's own agent by a :class:`CloneReplica`, a remote one by a :class:`CopyProcess` on
its command stream. The copy counts as a spare of the donor's node on its way; it joins as a
spare and the ordinary recovery (:mod:`recovery_steps`) hands it the dead slot: the state
transfer then carries only the step number, since the copy holds the donor's whole state.

:func:`copied` takes the agent's outcome (a remote agent's comes back as a
:class:`CopyOutcome`): a :class:`ReplicaCloned` is kept for the round's ``recovery_done``
(bytes moved, the copy's timeline); a :class:`CopyFailed` means no spare is coming, so the
recovery ends the job with the reason. A remote node lost meanwhile takes its spare on the way
with it (:func:`departures.node_lost`), and its donor's death restarts the round.

A drain (:mod:`handover`) needs no spare either: at the boundary, :func:`migrations` tells each
drained worker to park and its node's agent to move it (:class:`MigrateWorker` /
:class:`CopyProcess`: dump, CRIU kills the original, restore under the same name, on the same
node; a copy moves like an original); the plan then re-forms the same members in a new
generation, and nothing is redone. Pure functions over the job's state.
"""

from __future__ import annotations

from torchrelay.config import JobConfig
from torchrelay.control.actions import (
    Action,
    CloneReplica,
    MigrateWorker,
    Record,
    Send,
    SendToNode,
)
from torchrelay.control.endings import fail
from torchrelay.control.errors import ProtocolError
from torchrelay.control.plan_publish import next_step
from torchrelay.control.protocol import CopyProcess, Park
from torchrelay.control.spares import spare_accounted
from torchrelay.control.state import JobState, Member, MemberState, RecoveryStep, Round
from torchrelay.event_base import Event
from torchrelay.events_criu import CopyFailed, ReplicaCloned, WorkerMigrated


def donors(job: JobState, survivors: list[Member], near: list[str | None]) -> list[Member]:
    """One donor per failed slot, whose node is ``near[i]`` (the node of the process that held
    it): the live survivor least used so far, then on that node (its RNG mirror is there, see
    :mod:`torchrelay.transparent.rng_mirror`), then on the controller's, then the others by
    name; highest slot first (rank 0 is the one a script most often treats specially). None
    if no survivor is live. A copy made by an earlier recovery is a donor like any (it runs in
    a PID namespace of its own, which CRIU dumps with it: :mod:`torchrelay.transparent.nsinit`)."""
    live = [m for m in survivors if m.state is not MemberState.DEAD]
    used: dict[str, int] = {}
    chosen: list[Member] = []
    for node in near if live else []:
        donor = min(
            live,
            key=lambda m: (
                used.get(m.process, 0),
                m.node != node,
                m.node != job.local_node,
                m.node,
                -(m.slot or 0),
            ),
        )
        used[donor.process] = used.get(donor.process, 0) + 1
        chosen.append(donor)
    return chosen


def clone_for(job: JobState, slots: list[int], survivors: list[Member], now: float) -> list[Action]:
    """Order one clone per failed slot, each made on its donor's node (none if no survivor is
    left: the recovery then finds no spare coming and says why)."""
    near = [_node_of_slot(job, slot) for slot in slots]
    actions: list[Action] = []
    for slot, donor in zip(slots, donors(job, survivors, near), strict=False):
        job.spares_launching[donor.node] = job.spares_launching.get(donor.node, 0) + 1
        actions += [
            Send(donor.process, Park(generation=job.generation)),
            _copy(job, donor, "clone", slot, now),
        ]
    return actions


def _node_of_slot(job: JobState, slot: int) -> str | None:
    """The node of the process that last held ``slot`` (it is dead: it held it until now)."""
    process = job.assignments.get(slot)
    member = job.members.get(process) if process is not None else None
    return member.node if member is not None else None


def _copy(job: JobState, member: Member, kind: str, slot: int, now: float) -> Action:
    """Have ``member``'s node agent copy it: the controller's own directly, a remote one by a
    command on its stream (its outcome comes back as a ``copied`` node report)."""
    if member.node == job.local_node:
        order = CloneReplica if kind == "clone" else MigrateWorker
        return order(member.process, slot, job.generation, now)
    command = CopyProcess(
        kind=kind, process=member.process, slot=slot, generation=job.generation, ordered=now
    )
    return SendToNode(member.node, command)


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
            member = job.members[wanted["process"]]
            park = Park(generation=job.generation)
            actions += [Send(member.process, park), _copy(job, member, "migrate", int(slot), now)]
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


def copied(job: JobState, event: Event, node: str | None) -> list[Action]:
    """The outcome of a :class:`CloneReplica` / :class:`MigrateWorker` (or of a
    :class:`CopyProcess`) from the agent of ``node``; :class:`ProtocolError` if the process it
    names is not one of that node's (a remote agent speaks for its own processes only)."""
    original = event.donor if isinstance(event, ReplicaCloned) else event.process  # type: ignore[attr-defined]
    member = job.members.get(original)
    if member is None or member.node != node:
        raise ProtocolError(f"{original!r} is no process of node {node!r}: not its copy to report")
    current = job.recovery.current
    if isinstance(event, ReplicaCloned | WorkerMigrated) and current is not None:
        current.copies.append(event.to_json())
    if isinstance(event, CopyFailed) and event.kind == "clone":
        spare_accounted(job, node)  # no spare comes of it
    moved = isinstance(event, WorkerMigrated) or (
        isinstance(event, CopyFailed) and event.kind == "migrate"
    )
    if moved and current is not None and current.handover is not None:
        current.handover.setdefault("moves", {})[event.process] = event.TAG  # type: ignore[attr-defined]
    return [Record(event)]
