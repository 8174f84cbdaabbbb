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
coming, so the recovery ends the job with the reason. Pure functions over the job's state.
"""

from __future__ import annotations

from torchrelay.control.actions import Action, CloneReplica, Record, Send
from torchrelay.control.protocol import Park
from torchrelay.control.spares import spare_accounted
from torchrelay.control.state import JobState, Member, MemberState
from torchrelay.event_base import Event
from torchrelay.events_criu import CopyFailed, ReplicaCloned


def donors(job: JobState, survivors: list[Member], needed: int) -> list[Member]:
    """Up to ``needed`` donors, one per failed slot: live survivors on the controller's node,
    highest slot first (rank 0 is the one a script most often treats specially)."""
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


def copied(job: JobState, event: Event) -> list[Action]:
    """The agent's outcome of a :class:`CloneReplica` (see the module doc)."""
    current = job.recovery.current
    if isinstance(event, ReplicaCloned) and current is not None:
        current.copies.append(event.to_json())
    if isinstance(event, CopyFailed) and job.local_node is not None:
        spare_accounted(job, job.local_node)  # no spare comes of it
    return [Record(event)]
