"""The four systems under test, each a :class:`System` that runs one job and reports where
its outputs are. ``SYSTEMS`` is the order they appear in tables and plots."""

from __future__ import annotations

from bench.systems.base import RunOutput, RunSpec, System
from bench.systems.ddp import PlainDDP
from bench.systems.torchft_ddp import TorchftDDP
from bench.systems.torchrelay_spare import TorchrelaySpare
from bench.systems.torchrun_ckpt import TorchrunCheckpoint

__all__ = ["SYSTEMS", "RunOutput", "RunSpec", "System", "make_systems"]


def make_systems(ckpt_every: int, heartbeat_ms: int) -> list[System]:
    """The four systems, configured, in report order."""
    return [PlainDDP(), TorchrunCheckpoint(ckpt_every), TorchftDDP(heartbeat_ms), TorchrelaySpare()]


SYSTEMS = ("ddp", "torchrun_ckpt", "torchft", "torchrelay")
