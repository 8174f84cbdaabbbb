"""Parking: a pool lender at its minimum halts whole at a step boundary and resumes exactly.

When the pool must borrow and no lender can shrink (see :mod:`torchrelay.pool.policy`), it asks
a lender to *park*: :func:`park` requests a planned handover of every slot, of kind
:data:`PARK`, which needs no spare (:func:`torchrelay.control.elastic.needs_spare`). At the
boundary B every rank halts right after committing B, exactly as for a drain
(:mod:`torchrelay.control.handover`), and waits in place for a plan: its state stays in its
own process's memory (on a GPU node it would first move its tensors to host memory and free
the device; on a CPU node it simply stops computing). :func:`hold` keeps the round in ``HALT``
without a deadline (``job_parked``), and :func:`view` tells the pool the job is parked, which
moves its slots away. Halted processes keep heartbeating and no step is in flight, so the
monitor sees live, idle processes: a parked job is never taken for hung.

:func:`unpark` (the pool paid the loan back) releases the hold: the plan re-forms the same
members at B (nobody is replaced, nothing is transferred, no step is redone), and the job
goes on from B + 1 (``job_unparked``, then ``handover_done``).

Refused (one line, reported to the pool, which fails the loan): a job that is not running, a
recovery or handover under way, a job that opted out (``--no-park``).
"""

from __future__ import annotations

from typing import Any

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control.actions import Action, Record, StartRecovery
from torchrelay.control.errors import ProtocolError
from torchrelay.control.state import GONE, JobPhase, JobState, Round

PARK = "park"
"""The ``kind`` of a handover request that parks its slot (every slot of the job at once)."""


def park(job: JobState, config: JobConfig, loan: int, borrower: str, now: float) -> list[Action]:
    """Ask every process to halt after the next step boundary and wait there for the pool;
    :class:`ProtocolError` (one line) when refused (see the module doc)."""
    if config.pool is not None and not config.pool.parkable:
        raise ProtocolError("the job was started with --no-park")
    if job.phase is not JobPhase.RUNNING:
        raise ProtocolError("the job is not running: nothing to park")
    if job.recovery.handovers or job.recovery.current is not None:
        raise ProtocolError("a recovery or handover is under way: park after it")
    members = [m for m in job.slot_members() if m.state not in GONE]
    reason = f"parked for {borrower} (loan {loan})"
    for member in members:
        assert member.slot is not None
        job.recovery.handovers[member.slot] = {
            "process": member.process,
            "reason": reason,
            "since": now,
            "trigger": None,
            "kind": PARK,
            "loan": loan,
            "borrower": borrower,
        }
    asked = events.HandoverRequested(
        slots=tuple(sorted(m.slot for m in members)),  # type: ignore[type-var]
        processes=tuple(m.process for m in members),
        reason=reason,
        since=now,
    )
    return [Record(asked), StartRecovery()]


def parks(requests: dict[Any, dict[str, Any]]) -> bool:
    """Whether a handover round's ``requests`` park the job."""
    return bool(requests) and all(r.get("kind") == PARK for r in requests.values())


def hold(job: JobState, current: Round, now: float, actions: list[Action]) -> bool:
    """Called once every rank of a handover round halted: ``True`` while a park round waits
    for the pool (its first call records ``job_parked``)."""
    handover = current.handover
    if handover is None or not parks(handover["requests"]) or "unparked" in handover:
        return False
    if "parked" not in handover:
        handover["parked"] = now
        request = next(iter(handover["requests"].values()))
        halted = events.JobParked(
            loan=int(request["loan"]),
            borrower=str(request["borrower"]),
            step=int(handover["boundary"]),
            processes=tuple(current.survivors),
        )
        actions.append(Record(halted))
    return True


def parked(job: JobState) -> bool:
    """Whether the job is parked: every rank halted at a park round's boundary."""
    current = job.recovery.current
    if current is None or current.handover is None:
        return False
    return "parked" in current.handover and "unparked" not in current.handover


def unpark(job: JobState, loan: int, slots: list[int], now: float) -> list[Action]:
    """The pool gave the job's slots back: the parked round publishes its plan (the same
    members, from the boundary). :class:`ProtocolError` if the job is not parked."""
    if not parked(job):
        raise ProtocolError(f"unpark (loan {loan}): the job is not parked")
    current = job.recovery.current
    assert current is not None and current.handover is not None
    current.handover["unparked"] = now
    resumed = events.JobUnparked(
        loan=loan,
        slots=tuple(slots),
        step=int(current.handover["boundary"]),
        parked_seconds=now - float(current.handover["parked"]),
    )
    return [Record(resumed), StartRecovery()]
