"""torchrelay with one hot spare: ``torchrelay run --spares 1`` (no rollback)."""

from __future__ import annotations

import sys
import time

from bench.procs import WORKERS, ProcessSet, wait_exit
from bench.systems.base import RunOutput, RunSpec


class TorchrelaySpare:
    """The launcher replaces a killed worker with a hot spare fed from the survivors;
    ``launcher_args`` are added to ``torchrelay run`` (e.g. ``--no-template``)."""

    name = "torchrelay"
    label = "torchrelay + spare"
    tolerates_failures = True

    def __init__(self, launcher_args: tuple[str, ...] = ()) -> None:
        self.launcher_args = launcher_args

    def run(self, spec: RunSpec) -> RunOutput:
        run_dir = spec.workdir / "relay"
        cmd = [
            # Not the console script: a checkout that is not installed has none (PYTHONPATH).
            sys.executable,
            "-m",
            "torchrelay.cli.main",
            "run",
            "--nproc-per-node",
            str(spec.world),
            "--spares",
            "1",
            "--run-dir",
            str(run_dir),
            "--quiet",
            *self.launcher_args,
            str(WORKERS / "relay_worker.py"),
            *spec.worker_args(),
        ]
        start = time.monotonic()
        with ProcessSet() as procs:
            proc = procs.start(cmd, spec.workdir / "torchrelay.log")
            code = wait_exit(proc, start + spec.timeout_s)
        return RunOutput(
            wall_s=time.monotonic() - start, returncode=code, ledger=run_dir / "ledger.jsonl"
        )
