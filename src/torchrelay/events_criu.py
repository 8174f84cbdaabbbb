"""Ledger events of transparent mode's process copies (CRIU): a live replica cloned to rebuild
a dead slot, a worker moved by a drain. Registered in :data:`torchrelay.events.EVENTS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchrelay.event_base import Event


@dataclass(frozen=True, kw_only=True)
class ReplicaCloned(Event):
    """The node agent copied the parked ``donor`` into the new process ``process`` (a spare
    that takes slot ``slot``). The timeline is wall time: ``ordered`` (the park was asked),
    ``parked`` (the donor's sockets were closed), ``dumped``, ``restored`` (both released).
    ``bytes``: the snapshot's size, all of it moved through the images."""

    TAG: ClassVar[str] = "replica_cloned"
    donor: str
    process: str
    slot: int
    generation: int
    ordered: float
    parked: float
    dumped: float
    restored: float
    bytes: int
    dump_seconds: float
    restore_seconds: float


@dataclass(frozen=True, kw_only=True)
class WorkerMigrated(Event):
    """A drain moved ``process`` (slot ``slot``) into a restored copy of itself, same name and
    identity; timeline and cost as in :class:`ReplicaCloned`."""

    TAG: ClassVar[str] = "worker_migrated"
    process: str
    slot: int
    generation: int
    ordered: float
    parked: float
    dumped: float
    restored: float
    bytes: int
    dump_seconds: float
    restore_seconds: float


@dataclass(frozen=True, kw_only=True)
class CopyFailed(Event):
    """A clone or a migration of ``process`` could not be made: ``reason`` is CRIU's one line
    (it names the log it kept) or the park channel's. The donor, if alive, goes on."""

    TAG: ClassVar[str] = "copy_failed"
    process: str
    kind: str  # "clone" or "migrate"
    reason: str
