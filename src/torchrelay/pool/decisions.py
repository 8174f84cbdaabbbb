"""The pool's decisions, pure functions over :class:`~torchrelay.pool.state.PoolState` (issue 13,
items 1, 3 and 4; not served yet): what a job gets when it asks for a slot, whom it borrows
from, and who gets a slot that comes free.

- :func:`attach`: a job takes ``nproc`` idle slots (refused with one line if there are not
  enough, or for a bad minimum).
- :func:`want_slot`: a job needs a slot (a failure with no spare of its own). An idle slot is
  granted at once; else the lender is the lowest-priority job that can give one without going
  below its minimum, is not recovering (never borrow from a job mid-recovery) and has not waited
  for a slot it lent longer than ``starve_seconds`` (a lender is not starved forever); ties go to
  the job owed fewest slots, then to the largest. The lender releases that slot at its next step
  boundary (``Controller.release``, an ``--elastic`` shrink) and is owed one slot.
- :func:`slot_freed`: a slot comes free (a job finished, a node was repaired). The oldest debt
  is paid first, so lenders grow back in the order they lent; with no debt the slot is idle: a
  spare for every job.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchrelay.pool.state import Loan, PoolJob, PoolState


class PoolError(ValueError):
    """A request the pool refuses; the message is one line saying why."""


@dataclass(frozen=True)
class Grant:
    """``slot`` now belongs to ``job``: start its process there."""

    slot: str
    job: str


@dataclass(frozen=True)
class Borrow:
    """``lender`` must release ``slot`` at its next step boundary; then ``borrower`` gets it."""

    slot: str
    lender: str
    borrower: str


@dataclass(frozen=True)
class Repay:
    """``slot`` goes back to ``lender`` (it grows back onto it), ending its oldest loan."""

    slot: str
    lender: str


@dataclass(frozen=True)
class NoSlot:
    """Nothing can be given to ``job`` now; ``reason`` says why."""

    job: str
    reason: str


def attach(pool: PoolState, name: str, priority: int, min_nproc: int, nproc: int) -> list[Grant]:
    """Attach job ``name`` with ``nproc`` processes on idle slots."""
    if name in pool.jobs:
        raise PoolError(f"a job named {name!r} is already attached")
    if not 1 <= min_nproc <= nproc:
        raise PoolError(f"--min-nproc must be in [1, {nproc}], not {min_nproc}")
    idle = pool.idle()
    if len(idle) < nproc:
        raise PoolError(f"{name} needs {nproc} slots but the pool has {len(idle)} idle")
    pool.jobs[name] = PoolJob(name, priority, min_nproc)
    grants = [Grant(slot, name) for slot in idle[:nproc]]
    for grant in grants:
        pool.holders[grant.slot] = name
    return grants


def want_slot(
    pool: PoolState, borrower: str, now: float, starve_seconds: float
) -> Grant | Borrow | NoSlot:
    """A slot for ``borrower`` (see the module doc)."""
    if borrower not in pool.jobs:
        raise PoolError(f"no job named {borrower!r} is attached")
    idle = pool.idle()
    if idle:
        pool.holders[idle[0]] = borrower
        return Grant(idle[0], borrower)
    lender = choose_lender(pool, borrower, now, starve_seconds)
    if lender is None:
        return NoSlot(borrower, "no idle slot, and no lower-priority job can give one now")
    slot = pool.held_by(lender)[-1]
    pool.holders[slot] = borrower
    pool.loans.append(Loan(slot, lender, borrower, now))
    return Borrow(slot, lender, borrower)


def choose_lender(pool: PoolState, borrower: str, now: float, starve_seconds: float) -> str | None:
    """The job ``borrower`` borrows from, or ``None`` (see the module doc)."""
    priority = pool.jobs[borrower].priority

    def can_lend(job: PoolJob) -> bool:
        owed = pool.lent_by(job.name)
        starving = any(now - loan.since > starve_seconds for loan in owed)
        return (
            job.name != borrower
            and job.priority < priority
            and not job.recovering
            and len(pool.held_by(job.name)) - 1 >= job.min_nproc
            and not starving
        )

    lenders = [job for job in pool.jobs.values() if can_lend(job)]
    if not lenders:
        return None
    best = min(
        lenders,
        key=lambda j: (j.priority, len(pool.lent_by(j.name)), -len(pool.held_by(j.name)), j.name),
    )
    return best.name


def slot_freed(pool: PoolState, slot: str) -> Repay | None:
    """``slot`` came free: repay the oldest debt with it, else leave it idle (``None``)."""
    if slot not in pool.slots:
        raise PoolError(f"no slot {slot!r} in this pool")
    pool.holders[slot] = None
    owed = [loan for loan in pool.loans if loan.lender in pool.jobs]
    if not owed:
        return None
    oldest = min(owed, key=lambda loan: loan.since)
    pool.loans.remove(oldest)
    pool.holders[slot] = oldest.lender
    return Repay(slot, oldest.lender)


def detach(pool: PoolState, name: str) -> list[Repay]:
    """Job ``name`` ended: its debts are void and its slots come free (repaying others)."""
    if pool.jobs.pop(name, None) is None:
        raise PoolError(f"no job named {name!r} is attached")
    pool.loans = [loan for loan in pool.loans if loan.lender != name]
    repaid = [slot_freed(pool, slot) for slot in pool.held_by(name)]
    return [r for r in repaid if r is not None]
