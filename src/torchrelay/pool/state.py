"""The pool's state as plain data: slots, attached jobs and loans (see :mod:`.policy`).

A slot is owned by one job, idle, or broken (its process died there: it is not handed out
again until ``torchrelay pool`` restarts -- a repaired node is not modelled yet). A loan moves a
slot from a lender to a borrower, by one of two :class:`LoanKind`: a *shrink* (the lender gives
one process up) or a *park* (the lender, at its minimum, halts whole at a step boundary and
gives every slot it holds up: one to the borrower, the others to the pool; it is paid back all
at once, ``count`` slots):

| ``LoanState`` | may move to | by |
|---|---|---|
| ASKED (lender asked to release) | ACTIVE | the lender has one process less (a shrink) or
reports itself parked (a park): the slot moves |
| | FAILED | the lender refused the release, or one of the two left |
| ACTIVE (the borrower holds it) | RETURNED | a slot came back: the lender grows onto it |
| RETURNED, FAILED | (final) | |

The whole state round-trips through JSON (``to_dict`` / ``from_dict``), which is what the
service stores in its :class:`~torchrelay.control.store.StateBackend`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

IDLE = ""
"""The owner of a slot no job holds."""
BROKEN = "!broken"
"""The owner of a slot a process died on (not a job name: job names are checked, see
:func:`torchrelay.pool.policy.check_name`)."""


class LoanKind(enum.Enum):
    SHRINK = "shrink"
    PARK = "park"


class LoanState(enum.Enum):
    ASKED = "asked"
    ACTIVE = "active"
    RETURNED = "returned"
    FAILED = "failed"


_MOVES = {
    LoanState.ASKED: frozenset({LoanState.ACTIVE, LoanState.FAILED}),
    LoanState.ACTIVE: frozenset({LoanState.RETURNED}),
    LoanState.RETURNED: frozenset(),
    LoanState.FAILED: frozenset(),
}


class IllegalLoanMove(RuntimeError):
    """A loan moved in a way the table in the module doc does not allow (a bug)."""


@dataclass
class Loan:
    """One slot lent by ``lender`` to ``borrower``; ``slot`` is set once it moved; ``count``:
    the slots the lender gave up (1 for a shrink, every slot it held for a park)."""

    id: int
    borrower: str
    lender: str
    asked: float
    state: LoanState = LoanState.ASKED
    slot: int | None = None
    note: str = ""
    kind: LoanKind = LoanKind.SHRINK
    count: int = 1

    def move(self, to: LoanState, note: str = "") -> None:
        if to not in _MOVES[self.state]:
            raise IllegalLoanMove(f"loan {self.id}: {self.state.value} -> {to.value}")
        self.state = to
        self.note = note or self.note

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state.value, "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Loan:
        kind = LoanKind(data.get("kind", LoanKind.SHRINK.value))  # stored before parking
        return cls(**{**data, "state": LoanState(data["state"]), "kind": kind})


@dataclass
class PoolJob:
    """An attached job as its launcher last reported it.

    ``size``: its world size (the slots it starts with); ``min_nproc``: the fewest processes it
    may shrink to (``size`` for a job that cannot shrink); ``processes``: its live processes
    (workers and spares); ``recovering``: a recovery or handover is under way; ``wanted``:
    replacement slots it asked for and has not been given or refused; ``lent_at``: when it
    was last asked to lend (for the starvation rule); ``parkable``: it may park whole when it
    cannot shrink (its launcher supports parking and the job did not opt out); ``parked``:
    every process of it halted at a step boundary, as it last reported."""

    name: str
    size: int
    min_nproc: int
    priority: int
    elastic: bool
    processes: int = 0
    recovering: bool = False
    wanted: int = 0
    lent_at: list[float] = field(default_factory=list)
    parkable: bool = False
    parked: bool = False
    # Commands not yet fetched by the job's link: {"type": "grant" | "refuse" | "release" |
    # "grow" | "park" | "unpark", ...} (see torchrelay.pool.policy).
    commands: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PoolState:
    """Every slot's owner (a job name, :data:`IDLE` or :data:`BROKEN`), the jobs, the loans."""

    slots: list[str]
    jobs: dict[str, PoolJob] = field(default_factory=dict)
    loans: list[Loan] = field(default_factory=list)

    def held(self, job: str) -> list[int]:
        return [i for i, owner in enumerate(self.slots) if owner == job]

    def idle(self) -> list[int]:
        return [i for i, owner in enumerate(self.slots) if owner == IDLE]

    def loans_in(self, *states: LoanState) -> list[Loan]:
        return [loan for loan in self.loans if loan.state in states]

    def parked_lenders(self) -> set[str]:
        """The jobs that parked for a loan not paid back yet."""
        active = self.loans_in(LoanState.ACTIVE)
        return {loan.lender for loan in active if loan.kind is LoanKind.PARK}

    def to_dict(self) -> dict[str, Any]:
        return {
            "slots": list(self.slots),
            "jobs": {name: asdict(job) for name, job in self.jobs.items()},
            "loans": [loan.to_dict() for loan in self.loans],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolState:
        return cls(
            slots=list(data["slots"]),
            jobs={name: PoolJob(**job) for name, job in data["jobs"].items()},
            loans=[Loan.from_dict(loan) for loan in data["loans"]],
        )
