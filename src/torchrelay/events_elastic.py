"""Ledger events of an ``--elastic`` job changing size (see :mod:`torchrelay.control.elastic`).
Registered in :data:`torchrelay.events.EVENTS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchrelay.event_base import Event


@dataclass(frozen=True, kw_only=True)
class JobShrunk(Event):
    """``slots`` lost their process and no spare could come (or an operator released them):
    from ``generation`` on, ``hosts`` (virtual slot -> host slot, every hosted slot) says whose
    process runs their micro-batches too; ``processes`` processes remain, the global batch and
    the world size are unchanged. ``reason``: the failure or the release."""

    TAG: ClassVar[str] = "job_shrunk"
    generation: int
    slots: tuple[int, ...]
    hosts: dict[str, int]
    processes: int
    target_step: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class JobGrown(Event):
    """Hosted ``slots`` run on processes of their own again from ``generation`` on
    (``processes``: slot -> its new process, which received the state at ``target_step``);
    ``hosts``: the slots still hosted."""

    TAG: ClassVar[str] = "job_grown"
    generation: int
    slots: tuple[int, ...]
    processes: dict[str, str]
    hosts: dict[str, int]
    target_step: int
