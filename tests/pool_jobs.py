"""Jobs that share a ``torchrelay pool`` (tests and ``bench.pool``): the pool, and the set-up
of a lender L and a borrower H that the pool's multi-process tests share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.jobs import await_status, cli, move_leash, start_job


@dataclass(frozen=True)
class Pool:
    """A running ``torchrelay pool`` (its output in ``log``)."""

    process: subprocess.Popen[bytes]
    address: str
    token: str
    log: Path

    def attach(self) -> tuple[str, ...]:
        """The launcher's arguments that attach a job to this pool."""
        return ("--pool", self.address, "--pool-token", self.token)

    def loans(self) -> list[dict[str, Any]]:
        """The loans the pool reports (``torchrelay status --pool``)."""
        status = cli("status", "--pool", self.address, "--pool-token", self.token, "--json")
        assert status.returncode == 0, status.stderr
        return json.loads(status.stdout)["loans"]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=30)


def start_pool(where: Path, slots: int = 4, timeout: float = 60) -> Pool:
    """``torchrelay pool --slots SLOTS``, once it has written its address (``timeout``: a
    failsafe; the wait ends when the address is there)."""
    where.mkdir(parents=True, exist_ok=True)
    token, address, log = where / "pool.token", where / "pool.address", where / "pool.log"
    command = [sys.executable, "-m", "torchrelay.cli.main", "pool", "--slots", str(slots)]
    command += ["--token-file", str(token), "--address-file", str(address)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while not address.exists() or not address.read_text().endswith("\n"):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return Pool(process, address.read_text().strip(), str(token), log)


@dataclass
class LenderAndBorrower:
    """Job L (priority 0, held on ``leash``) and job H (priority 10, no spare, its rank 1
    killed at step 5), each 2 ranks of tests/scripts/mlp_train.py, in one pool."""

    pool: Pool
    low: subprocess.Popen[str]
    high: subprocess.Popen[str]
    low_dir: Path
    high_dir: Path
    leash: Path


@contextmanager
def lender_and_borrower(
    where: Path, steps: int, lend_at: int, pace: tuple[str, ...], elastic: bool
) -> Iterator[LenderAndBorrower]:
    """L started and held at ``lend_at``, then H, whose kill makes the pool take a slot of
    L's (``elastic``: L may shrink; else it parks whole). Every process of the three is gone
    when the block ends, however it ends."""
    pool = start_pool(where)
    low_dir, high_dir, leash = where / "L", where / "H", where / "leash"
    move_leash(leash, lend_at)
    low = high = None
    try:
        low = start_job(
            low_dir,
            nproc=2,
            spares=0,
            steps=steps,
            launcher_args=(*pool.attach(), "--priority", "0", "--job-name", "L")
            + (("--elastic",) if elastic else ()),
            script_args=("--leash", str(leash), *pace),
        )
        await_status(low_dir, lambda s: s["steps_committed"] >= lend_at - 1)
        high = start_job(
            high_dir,
            nproc=2,
            spares=0,
            steps=steps,
            chaos=("kill:rank=1:step=5",),
            launcher_args=(*pool.attach(), "--priority", "10", "--job-name", "H"),
            script_args=pace,
        )
        yield LenderAndBorrower(pool, low, high, low_dir, high_dir, leash)
    finally:
        for job in (low, high):
            if job is not None and job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        pool.stop()
