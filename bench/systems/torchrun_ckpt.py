"""The status quo: torchrun ``--max-restarts`` + ``torch.save`` every K steps (rolls back)."""

from __future__ import annotations

from bench.systems._torchrun import run_torchrun
from bench.systems.base import RunOutput, RunSpec


class TorchrunCheckpoint:
    """Every failure restarts all workers, which resume from the last checkpoint."""

    name = "torchrun_ckpt"
    label = "torchrun + ckpt"
    tolerates_failures = True

    def __init__(self, ckpt_every: int) -> None:
        self.ckpt_every = ckpt_every

    def run(self, spec: RunSpec) -> RunOutput:
        extra = ["--ckpt-every", str(self.ckpt_every), "--ckpt-path", str(spec.workdir / "ckpt.pt")]
        # One restart per scheduled kill, plus one spare so a slow restart is not fatal.
        return run_torchrun(spec, max_restarts=len(spec.kill_steps) + 1, worker_extra=extra)
