"""torchft 0.2.0: a lighthouse, one replica group per worker, killed groups restarted.

This module plays the supervisor torchft expects (its docs use torchx/slurm): when a replica
group dies by a signal it is started again, as a fresh process, and torchft heals it from a
live replica. The lighthouse runs with ``--min_replicas 1`` so the survivor keeps training
alone meanwhile (torchft's fault-tolerant mode), and ``heartbeat_ms`` sets how long the
lighthouse keeps counting a dead replica (torchft's default is 5000 ms; lower is faster here).
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable

from bench.procs import BIN, WORKERS, ProcessSet, free_port, wait_listening, worker_env
from bench.systems.base import RunOutput, RunSpec

POLL_S = 0.01
FINISH_GRACE_S = 3.0


class TorchftDDP:
    """torchft's Manager + DDP + OptimizerWrapper, supervised by this process."""

    name = "torchft"
    label = "torchft"
    tolerates_failures = True

    def __init__(self, heartbeat_ms: int) -> None:
        self.heartbeat_ms = heartbeat_ms

    def run(self, spec: RunSpec) -> RunOutput:
        port = free_port()
        start = time.monotonic()
        deadline = start + spec.timeout_s
        notes: list[str] = []
        with ProcessSet() as procs:
            procs.start(
                [
                    str(BIN / "torchft_lighthouse"),
                    "--min_replicas",
                    "1",
                    "--bind",
                    f"[::]:{port}",
                    "--heartbeat_timeout_ms",
                    str(self.heartbeat_ms),
                    "--join_timeout_ms",
                    "1000",
                    "--quorum_tick_ms",
                    "20",
                ],
                spec.workdir / "lighthouse.log",
            )
            wait_listening(port, deadline)

            def launch(group: int, attempt: int) -> subprocess.Popen[bytes]:
                cmd = [
                    str(BIN / "python"),
                    str(WORKERS / "torchft_worker.py"),
                    "--group",
                    str(group),
                    "--groups",
                    str(spec.world),
                    "--lighthouse",
                    f"http://127.0.0.1:{port}",
                    *spec.worker_args(),
                ]
                return procs.start(
                    cmd,
                    spec.workdir / f"group{group}.log",
                    env=worker_env(BENCH_ATTEMPT=str(attempt)),
                )

            groups = {g: launch(g, 0) for g in range(spec.world)}
            code, done_at = self._supervise(groups, launch, deadline, notes)
        return RunOutput(wall_s=done_at - start, returncode=code, notes=notes)

    @staticmethod
    def _supervise(
        groups: dict[int, subprocess.Popen[bytes]],
        launch: Callable[[int, int], subprocess.Popen[bytes]],
        deadline: float,
        notes: list[str],
    ) -> tuple[int, float]:
        """Restarts groups killed by a signal until one group finishes the job.

        Returns (exit code, monotonic time the first group finished). After that no group is
        restarted, and groups still running ``FINISH_GRACE_S`` later are killed: a replica that
        restarted too late finds no live peer and, with ``min_replicas 1``, would train the
        whole job again alone from step 0 (the PEERS.md pitfall).
        """
        attempts = dict.fromkeys(groups, 0)
        finished: dict[int, int] = {}
        done_at = math.inf
        while len(finished) < len(groups):
            now = time.monotonic()
            if now > min(deadline, done_at + FINISH_GRACE_S):
                if done_at == math.inf:
                    raise TimeoutError("torchft job still running at its deadline")
                for group, proc in groups.items():
                    if group not in finished:
                        proc.kill()
                        finished[group] = 0
                        notes.append(f"group {group} still running after the job finished; killed")
                break
            for group, proc in groups.items():
                if group in finished or (code := proc.poll()) is None:
                    continue
                if code < 0 and done_at == math.inf:  # killed: a supervisor would restart it
                    attempts[group] += 1
                    notes.append(f"group {group} died by signal {-code}; restarted")
                    groups[group] = launch(group, attempts[group])
                else:
                    finished[group] = code
                    if code == 0:
                        done_at = min(done_at, now)
            time.sleep(POLL_S)  # several children: poll their exit status
        return max(finished.values(), key=abs), min(done_at, time.monotonic())
