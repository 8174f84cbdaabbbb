"""The slot pool's state as plain data (issue 13, item 1; not served yet).

A pool owns the device slots of a set of nodes. Jobs attach with a priority and a minimum size;
each slot is idle (a spare for every job), held by a job, or lent by one job to another. Like
the controller's :class:`~torchrelay.control.state.JobState`, :class:`PoolState` round-trips
through JSON (:meth:`PoolState.to_dict`, :meth:`PoolState.from_dict`) so that it can live in the
same state store (in memory or etcd); the decisions over it are pure functions in
:mod:`torchrelay.pool.decisions`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Slot:
    """One device of one node: ``node`` and ``device`` (its local index)."""

    node: str
    device: int

    @property
    def name(self) -> str:
        return f"{self.node}/{self.device}"


@dataclass
class PoolJob:
    """An attached job: higher ``priority`` borrows from lower; it never shrinks below
    ``min_nproc`` processes. ``recovering``: a recovery or handover is under way (nobody
    borrows from it then)."""

    name: str
    priority: int
    min_nproc: int
    recovering: bool = False


@dataclass
class Loan:
    """``slot`` of ``lender`` runs ``borrower``'s process since ``since``."""

    slot: str
    lender: str
    borrower: str
    since: float


@dataclass
class PoolState:
    """Every slot, its holder (``None``: idle), the attached jobs and the loans."""

    slots: dict[str, Slot] = field(default_factory=dict)
    holders: dict[str, str | None] = field(default_factory=dict)  # slot name -> job
    jobs: dict[str, PoolJob] = field(default_factory=dict)
    loans: list[Loan] = field(default_factory=list)

    @classmethod
    def of_nodes(cls, devices: dict[str, int]) -> PoolState:
        """A pool of ``devices[node]`` slots on each node, all idle."""
        slots = [Slot(node, d) for node, count in sorted(devices.items()) for d in range(count)]
        return cls(slots={s.name: s for s in slots}, holders={s.name: None for s in slots})

    def idle(self) -> list[str]:
        return [name for name, holder in self.holders.items() if holder is None]

    def held_by(self, job: str) -> list[str]:
        return [name for name, holder in self.holders.items() if holder == job]

    def lent_by(self, job: str) -> list[Loan]:
        return [loan for loan in self.loans if loan.lender == job]

    def to_dict(self) -> dict[str, Any]:
        return {
            "slots": {name: asdict(slot) for name, slot in self.slots.items()},
            "holders": dict(self.holders),
            "jobs": {name: asdict(job) for name, job in self.jobs.items()},
            "loans": [asdict(loan) for loan in self.loans],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolState:
        return cls(
            slots={name: Slot(**slot) for name, slot in data["slots"].items()},
            holders=dict(data["holders"]),
            jobs={name: PoolJob(**job) for name, job in data["jobs"].items()},
            loans=[Loan(**loan) for loan in data["loans"]],
        )
