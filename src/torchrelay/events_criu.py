"""Ledger events of transparent mode's process copies (CRIU): a live replica cloned to rebuild
a dead slot, a worker moved by a drain. Registered in :data:`torchrelay.events.EVENTS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torchrelay.event_base import Event
from torchrelay.ledger import LedgerError
from torchrelay.typed import registry


@dataclass(frozen=True, kw_only=True)
class _Copied(Event):
    """A process copied by its node agent: ``process`` (the copy's name) holds or takes slot
    ``slot`` of ``generation``. The timeline is wall time: ``ordered`` (the park was asked),
    ``parked`` (the original's sockets were closed), ``dumped``, ``restored`` (released).
    ``bytes``: the snapshot's size, all of it moved through the images."""

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
class ReplicaCloned(_Copied):
    """The parked ``donor`` was cloned into the new spare ``process``, to take slot ``slot``."""

    TAG: ClassVar[str] = "replica_cloned"
    donor: str


@dataclass(frozen=True, kw_only=True)
class WorkerMigrated(_Copied):
    """A drain moved ``process`` into a restored copy of itself: same name, same slot."""

    TAG: ClassVar[str] = "worker_migrated"


@dataclass(frozen=True, kw_only=True)
class CopyFailed(Event):
    """A clone or a migration of ``process`` could not be made: ``reason`` is CRIU's one line
    (it names the log it kept) or the park channel's. The donor, if alive, goes on."""

    TAG: ClassVar[str] = "copy_failed"
    process: str
    kind: str  # "clone" or "migrate"
    reason: str


OUTCOMES = registry(ReplicaCloned, WorkerMigrated, CopyFailed)


def parse_outcome(entry: Any) -> Event:
    """What a node agent's copy ended with, as a remote one sends it back (see
    :class:`torchrelay.control.protocol.CopyOutcome`); :class:`LedgerError` if it is not one."""
    name = entry.get("event") if isinstance(entry, dict) else None
    cls = OUTCOMES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise LedgerError(f"event {name!r} is not the outcome of a copy")
    return cls.from_json(entry)
