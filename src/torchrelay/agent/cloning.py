"""The node agent's part of transparent mode's recoveries: clone a parked replica into a spare,
or move a drained worker into a copy of itself.

The controller tells a live replica (the donor) to park (:class:`~torchrelay.control.protocol.
Park`) and asks this node's agent to copy it (:class:`~torchrelay.control.actions.
CloneReplica`). :func:`clone_replica` then, off the controller's lock:

1. waits until the donor parks (its sockets closed, see :mod:`torchrelay.runtime.parking`);
2. copies it with CRIU (:meth:`NodeAgent.clone`: dump ``--leave-running``, restore in a fresh
   PID namespace) under a new spare's name;
3. answers the donor ``CONTINUE`` and the copy ``BECOME``: the spare's name, role and device,
   the store and the controller to reconnect to. The copy joins as a spare and the ordinary
   recovery plan hands it the dead slot.

It returns the ledger event that says what happened: :class:`ReplicaCloned`, or
:class:`CopyFailed` with one line (the donor is then released with ``CONTINUE`` if it can be,
and the recovery finds no spare coming). It never raises for a CRIU or park failure.

:func:`migrate_worker` is a drain's move (:class:`MigrateWorker`): the worker parks at the
handover's boundary, is dumped (CRIU kills it) and restored under the same name, and is told
``CONTINUE``: same slot, same identity, nothing redone (:class:`WorkerMigrated`). A failed dump
leaves it running where it was (:class:`CopyFailed`); a failed restore is its death, which the
agent reports as any exit.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from torchrelay.control.actions import CloneReplica, MigrateWorker
from torchrelay.event_base import Event
from torchrelay.events_criu import CopyFailed, ReplicaCloned, WorkerMigrated
from torchrelay.transparent.cloner import Clone
from torchrelay.transparent.criu import CriuError, CriuUnavailable, RestoreFailed
from torchrelay.transparent.cuda import DeviceStateError, DeviceStateUnavailable
from torchrelay.transparent.park import Instruction, Kind, ParkError

# What a failed park or copy raises: reported as CopyFailed, never raised to the executor.
COPY_ERRORS = (
    CriuError,
    CriuUnavailable,
    DeviceStateError,
    DeviceStateUnavailable,
    ParkError,
    OSError,
)

if TYPE_CHECKING:  # the agent calls in here with itself
    from torchrelay.agent.agent import NodeAgent


def clone_replica(agent: NodeAgent, action: CloneReplica) -> Event:
    """Carry out ``action`` (see the module doc); blocks for the park and the copy."""
    donor, generation = action.donor, action.generation
    try:
        agent.parked(donor)
        parked = time.time()
        name = agent.new_spare_name()
        if name is None:
            raise ParkError("the node agent is stopping")
        copy = agent.clone(donor, name)
        agent.instruct(donor, Instruction(Kind.CONTINUE, generation))
        agent.instruct(name, become(agent, name, action))
    except COPY_ERRORS as exc:
        with contextlib.suppress(ParkError, KeyError):
            agent.instruct(donor, Instruction(Kind.CONTINUE, generation))
        return CopyFailed(process=donor, kind="clone", reason=str(exc).splitlines()[0])
    return ReplicaCloned(donor=donor, process=name, **_timeline(action, copy, parked))


def migrate_worker(agent: NodeAgent, action: MigrateWorker) -> Event:
    """Carry out ``action`` (see the module doc); blocks for the park and the move."""
    process, generation = action.process, action.generation
    try:
        agent.parked(process)
        parked = time.time()
        copy = agent.migrate(process)
        agent.instruct(process, Instruction(Kind.CONTINUE, generation))
    except COPY_ERRORS as exc:
        if not isinstance(exc, RestoreFailed):  # alive and parked: it goes on where it is
            with contextlib.suppress(ParkError, KeyError):
                agent.instruct(process, Instruction(Kind.CONTINUE, generation))
        return CopyFailed(process=process, kind="migrate", reason=str(exc).splitlines()[0])
    return WorkerMigrated(process=process, **_timeline(action, copy, parked))


def _timeline(action: CloneReplica | MigrateWorker, copy: Clone, parked: float) -> dict[str, Any]:
    """The fields of a copy's event that every copy has (see :class:`events_criu._Copied`)."""
    return {
        "slot": action.slot,
        "generation": action.generation,
        "ordered": action.ordered,
        "parked": parked,
        "dumped": parked + copy.dump_seconds,
        "restored": time.time(),
        "bytes": copy.bytes,
        "dump_seconds": copy.dump_seconds,
        "restore_seconds": copy.restore_seconds,
    }


def become(agent: NodeAgent, name: str, action: CloneReplica) -> Instruction:
    """The copy's new identity: a spare of this node, on the job's store and controller."""
    env = agent.environment
    return Instruction(
        Kind.BECOME,
        action.generation,
        slot=action.slot,
        world_size=agent.config.world_size,
        store=f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
        endpoint=env["TORCHRELAY_CONTROL"],
        env={
            "TORCHRELAY_PROCESS": name,
            "TORCHRELAY_ROLE": "spare",
            "LOCAL_RANK": str(agent.local_rank(name)),
        },
    )
