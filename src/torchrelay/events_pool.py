"""Ledger events of a job attached to a pool (``torchrelay run --pool``, see
:mod:`torchrelay.pool`): every pool decision that concerns the job. Registered in
:data:`torchrelay.events.EVENTS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchrelay.event_base import Event
from torchrelay.typed import optional


@dataclass(frozen=True, kw_only=True)
class PoolAttached(Event):
    """The job holds pool ``slots`` (at ``priority``, never below ``min_nproc`` processes)."""

    TAG: ClassVar[str] = "pool_attached"
    pool: str
    slots: tuple[int, ...]
    priority: int
    min_nproc: int


@dataclass(frozen=True, kw_only=True)
class PoolAsked(Event):
    """A recovery with no spare in sight asked the pool for ``slots`` replacement slots."""

    TAG: ClassVar[str] = "pool_asked"
    slots: int
    pool: str


@dataclass(frozen=True, kw_only=True)
class PoolGranted(Event):
    """The pool gave the job ``slot`` (an idle one, or lent by ``lender`` under ``loan``, of
    ``kind`` ``shrink`` or ``park``): a spare starts there."""

    TAG: ClassVar[str] = "pool_granted"
    slot: int
    lender: str | None = optional()
    loan: int | None = optional()
    kind: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class PoolRefused(Event):
    """The pool has no slot for the job now (``reason`` names why each job could not lend)."""

    TAG: ClassVar[str] = "pool_refused"
    reason: str


@dataclass(frozen=True, kw_only=True)
class PoolLend(Event):
    """The pool asked this job to lend a slot to ``borrower`` (``loan``), by ``kind``:
    ``shrink`` (``slot``'s process is released at the next step boundary) or ``park`` (the
    whole job halts there, see ``job_parked``); or ``refused`` with why."""

    TAG: ClassVar[str] = "pool_lend"
    loan: int
    borrower: str
    slot: int | None = optional()
    refused: str | None = optional()
    kind: str = "shrink"


@dataclass(frozen=True, kw_only=True)
class PoolReturned(Event):
    """A loan came back: the pool gave this job ``slot`` again; a spare starts there and the
    job regrows onto it."""

    TAG: ClassVar[str] = "pool_returned"
    loan: int
    slot: int


@dataclass(frozen=True, kw_only=True)
class JobParked(Event):
    """The pool asked this job (at its minimum) to park for ``borrower`` (``loan``): every
    process halted right after committing ``step`` and waits in place, its state in its own
    memory; the job's slots went to the pool."""

    TAG: ClassVar[str] = "job_parked"
    loan: int
    borrower: str
    step: int
    processes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class JobUnparked(Event):
    """The pool gave the parked job its ``slots`` back (``loan``): the same processes resume
    after ``step``, nothing redone; ``parked_seconds``: from the last halt to now."""

    TAG: ClassVar[str] = "job_unparked"
    loan: int
    slots: tuple[int, ...]
    step: int
    parked_seconds: float
