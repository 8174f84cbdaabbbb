"""Ledger events of durable checkpoints and of a job resumed from one (docs/checkpoints.md).
Registered in :data:`torchrelay.events.EVENTS`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torchrelay.event_base import Event
from torchrelay.typed import OMIT


@dataclass(frozen=True, kw_only=True)
class Progress(Event):
    """The highest committed step, recorded at most once a second by a job that writes
    checkpoints, so that a job resumed after its launcher died can count the steps it replays."""

    TAG: ClassVar[str] = "progress"
    step: int


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Event):
    """A complete checkpoint appeared (``path``: its directory; training resumes at step+1)."""

    TAG: ClassVar[str] = "checkpoint"
    step: int
    path: str


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """``torchrelay run --resume``: the job goes on from checkpoint ``from_step`` after an
    outage; ``steps_replayed`` committed steps are lost and computed again (not zero-loss).
    ``skipped``: newer checkpoints refused (corrupt, incomplete), one line each."""

    TAG: ClassVar[str] = "resumed"
    from_step: int
    checkpoint: str
    last_committed: int
    steps_replayed: int
    outage_seconds: float | None = field(default=None, metadata=OMIT)
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FallbackRestart(Event):
    """Live recovery was impossible (``reason``): the launcher stopped every process and
    restarted the job from checkpoint ``from_step`` (attempt ``attempt`` of --max-restarts);
    ``steps_lost`` committed steps are computed again (not zero-loss)."""

    TAG: ClassVar[str] = "fallback_restart"
    reason: str
    from_step: int
    checkpoint: str
    steps_lost: int
    attempt: int
