"""Plain torch DDP over gloo, no fault tolerance: the speed reference (a kill ends the job)."""

from __future__ import annotations

from bench.systems._torchrun import run_torchrun
from bench.systems.base import RunOutput, RunSpec


class PlainDDP:
    """torchrun with no restarts running the shared DDP worker."""

    name = "ddp"
    label = "plain DDP"
    tolerates_failures = False

    def run(self, spec: RunSpec) -> RunOutput:
        return run_torchrun(spec, max_restarts=0, worker_extra=[])
