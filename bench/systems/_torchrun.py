"""Launching ``bench/workers/ddp_worker.py`` under torchrun (plain DDP and checkpointing)."""

from __future__ import annotations

import time

from bench.procs import BIN, WORKERS, ProcessSet, free_port, wait_exit
from bench.systems.base import RunOutput, RunSpec


def run_torchrun(spec: RunSpec, max_restarts: int, worker_extra: list[str]) -> RunOutput:
    """Runs the DDP worker with ``spec.world`` processes; returns when torchrun exits."""
    cmd = [
        str(BIN / "torchrun"),
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(spec.world),
        "--max-restarts",
        str(max_restarts),
        "--monitor-interval",
        "0.1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        str(WORKERS / "ddp_worker.py"),
        *spec.worker_args(),
        *worker_extra,
    ]
    start = time.monotonic()
    with ProcessSet() as procs:
        proc = procs.start(cmd, spec.workdir / "torchrun.log")
        code = wait_exit(proc, start + spec.timeout_s)
    return RunOutput(wall_s=time.monotonic() - start, returncode=code)
