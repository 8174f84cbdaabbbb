"""A job's side of a pool (``torchrelay run --pool``): the controller carries out the pool's
commands (see :mod:`torchrelay.pool.policy`) and tells the pool what it needs to decide.

:func:`apply` is pure over :class:`JobState` (actions out, ledger events included);
:class:`PoolSide` is the controller mixin that runs it under the controller's lock.

- ``grant``: a spare starts (on the slot the pool gave; on this machine, as any spare); the
  recovery that asked for it waits for it as for any spare on its way;
- ``refuse``: nothing is asked any more; the recovery goes on as without a pool (an --elastic
  job shrinks, another stops);
- ``release``: the highest slot with a process of its own is released at the next step
  boundary (:func:`torchrelay.control.elastic.release`); a refusal is reported back;
- ``grow``: a loan came back: a spare starts and, once ready, a hosted slot regrows onto it;
- ``park``: every process halts after the next step boundary and waits in place
  (:mod:`torchrelay.control.parking`); a refusal is reported back;
- ``unpark``: the parked job's slots came back: the same processes resume from the boundary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control import elastic, parking
from torchrelay.control.actions import Action, Record, StartRecovery
from torchrelay.control.errors import ProtocolError
from torchrelay.control.spares import start_spare
from torchrelay.control.state import GONE, JobState


def view(job: JobState) -> tuple[int, bool, bool]:
    """``(live processes, recovering, parked)``: what the job reports to its pool. A process
    counts until it exited (a released one too), so a lent slot moves only once it is really
    free; a parked job's slots move once every process halted (it is not recovering then)."""
    live = sum(1 for m in job.members.values() if m.state not in GONE)
    if parking.parked(job):
        return live, False, True
    return live, job.recovery.current is not None or bool(job.recovery.handovers), False


def apply(
    job: JobState, config: JobConfig, command: dict[str, Any], now: float
) -> tuple[list[Action], str | None]:
    """The actions for one pool command, and for a refused ``release`` why (else ``None``)."""
    kind = command["type"]
    if kind == "grant":
        job.pool_asked = max(0, job.pool_asked - 1)
        granted = events.PoolGranted(
            slot=int(command["slot"]),
            lender=command.get("lender"),
            loan=command.get("loan"),
            kind=command.get("kind"),
        )
        spare = start_spare(job) if not job.finished else []
        return [Record(granted), *spare, StartRecovery()], None
    if kind == "refuse":
        job.pool_asked = max(0, job.pool_asked - 1)
        return [Record(events.PoolRefused(reason=str(command["reason"]))), StartRecovery()], None
    if kind == "release":
        return _lend(job, config, int(command["loan"]), str(command["borrower"]), now)
    if kind == "park":
        return _park(job, config, int(command["loan"]), str(command["borrower"]), now)
    if kind == "unpark":
        slots = [int(s) for s in command["slots"]]
        return parking.unpark(job, int(command["loan"]), slots, now), None
    if kind == "grow":
        returned = events.PoolReturned(loan=int(command["loan"]), slot=int(command["slot"]))
        spare = start_spare(job) if not job.finished else []
        return [Record(returned), *spare], None
    raise ProtocolError(f"unknown pool command {kind!r}")


def _lend(
    job: JobState, config: JobConfig, loan: int, borrower: str, now: float
) -> tuple[list[Action], str | None]:
    own = sorted(s for s, m in job.by_slot().items() if m.state not in GONE)
    try:
        if not own:
            raise ProtocolError("no slot has a process of its own")
        actions = elastic.release(job, config, own[-1], now)
    except ProtocolError as exc:
        refused = events.PoolLend(loan=loan, borrower=borrower, refused=str(exc))
        return [Record(refused)], str(exc)
    lent = events.PoolLend(loan=loan, borrower=borrower, slot=own[-1])
    return [Record(lent), *actions], None


def _park(
    job: JobState, config: JobConfig, loan: int, borrower: str, now: float
) -> tuple[list[Action], str | None]:
    try:
        actions = parking.park(job, config, loan, borrower, now)
    except ProtocolError as exc:
        refused = events.PoolLend(loan=loan, borrower=borrower, refused=str(exc), kind="park")
        return [Record(refused)], str(exc)
    return [Record(events.PoolLend(loan=loan, borrower=borrower, kind="park")), *actions], None


class PoolSide:
    """Controller mixin: the pool link's entry points (each one transition)."""

    job: JobState
    config: JobConfig
    _transition: Callable[..., Any]
    _apply: Callable[[list[Action]], None]
    _executor: Any
    _cond: Any

    def attach_pool(self, ask: Callable[[int], None]) -> None:
        """``ask(slots)`` sends a request for replacement slots (it must not block)."""
        self._executor.ask_pool = ask

    def pool_view(self) -> tuple[int, bool, bool]:
        with self._cond:
            return view(self.job)

    def pool_command(self, command: dict[str, Any]) -> str | None:
        """Carry out one pool command; returns why a ``release`` was refused (else None)."""
        with self._transition():
            actions, refused = apply(self.job, self.config, command, time.time())
            self._apply(actions)
            return refused
