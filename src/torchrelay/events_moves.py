"""Ledger events of the control plane's planned moves: handovers (drain, health migration) and
a standby taking the controller over. Registered in :data:`torchrelay.events.EVENTS`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torchrelay.event_base import Event
from torchrelay.typed import OMIT


@dataclass(frozen=True, kw_only=True)
class HandoverRequested(Event):
    """Slots to move to spares at a step boundary: ``reason`` (a drain, a health finding),
    the ``trigger`` reading if any, and ``since``: when the first warning was read."""

    TAG: ClassVar[str] = "handover_requested"
    slots: tuple[int, ...]
    processes: tuple[str, ...]
    reason: str
    since: float
    trigger: dict[str, Any] | None = field(default=None, metadata=OMIT)


@dataclass(frozen=True, kw_only=True)
class HandoverStart(Event):
    """Every rank was told to halt after committing ``boundary`` of ``generation``."""

    TAG: ClassVar[str] = "handover_start"
    slots: tuple[int, ...]
    generation: int
    boundary: int


@dataclass(frozen=True, kw_only=True)
class HandoverLate(Event):
    """``process`` (in ``slot``) was told the boundary only after committing ``step`` (>= the
    boundary) and going on into the next step. If a peer halted before that step, the step is
    aborted at once and redone; told late, every rank halts after it."""

    TAG: ClassVar[str] = "handover_late"
    process: str
    slot: int | None
    step: int


@dataclass(frozen=True, kw_only=True)
class HandoverDone(Event):
    """The slots run on their new processes (``replaced``: slot -> process); ``retired``: the
    processes that left. ``lead_seconds``: from the first warning to the handover's end;
    ``stall_seconds``: from the boundary (every rank halted) to the first step after."""

    TAG: ClassVar[str] = "handover_done"
    slots: tuple[int, ...]
    generation: int
    target_step: int
    replaced: dict[str, str]
    retired: tuple[str, ...]
    reason: str
    trigger: dict[str, Any] | None = field(default=None, metadata=OMIT)
    since: float
    lead_seconds: float
    stall_seconds: float
    recomputed_steps: int
    lost_steps: int
    bytes_transferred: int


@dataclass(frozen=True, kw_only=True)
class HandoverAbandoned(Event):
    """A handover that cannot be carried out (no spare, the job ends first); the slots stay
    where they were."""

    TAG: ClassVar[str] = "handover_abandoned"
    slots: tuple[int, ...]
    reason: str


@dataclass(frozen=True, kw_only=True)
class ControllerTakeover(Event):
    """A standby took the lead of the running job from its durable state (``term``: its
    leader term), after the controller on ``previous`` was lost."""

    TAG: ClassVar[str] = "controller_takeover"
    leader: str
    previous: str
    term: int
    generation: int
    committed: int
    control: str
    store: str
