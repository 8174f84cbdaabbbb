"""The ledger's events of chaos drills: a fault asked for, injected by a node agent, fired.

Registered with the others in :mod:`torchrelay.events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchrelay.chaos import ChaosEvent
from torchrelay.event_base import Event
from torchrelay.typed import optional


@dataclass(frozen=True, kw_only=True)
class ChaosRequested(Event):
    TAG: ClassVar[str] = "chaos_requested"
    fault: str
    process: str | None = optional()
    node: str | None = optional()
    seconds: float | None = optional()


@dataclass(frozen=True, kw_only=True)
class ChaosInjected(Event):
    """A node agent's notice about a drill (see ``protocol.ChaosNotice``)."""

    TAG: ClassVar[str] = "chaos_injected"
    node: str
    fault: str
    ok: bool
    interfaces: tuple[str, ...] | None = optional()
    seconds: float | None = optional()
    error: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class ChaosFired(Event):
    """A ``--chaos`` event fired (by a worker, or by ``agent@NODE`` for a node fault)."""

    TAG: ClassVar[str] = "chaos_fired"
    process: str
    id: int
    action: str
    rank: int
    step: int
    phase: str = "forward"
    seconds: float = 0.0
    node: int = -1

    @classmethod
    def of(cls, process: str, event: ChaosEvent) -> ChaosFired:
        return cls(
            process=process,
            id=event.id,
            action=event.action,
            rank=event.rank,
            step=event.step,
            phase=event.phase,
            seconds=event.seconds,
            node=event.node,
        )
