"""Find and wait for the processes of a real job (tests of the launcher's lifecycle)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchrelay.ledger import read_ledger


def job_pids(run_dir: Path) -> set[int]:
    """Live (not zombie) processes started for the job of ``run_dir``: every worker and spare
    carries ``TORCHRELAY_RUN_DIR`` in its environment, whoever its parent is now."""
    marker = f"TORCHRELAY_RUN_DIR={run_dir}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # it exited meanwhile, or it is not ours to read
            continue
        if state != "Z" and marker in environ.split(b"\0"):
            found.add(int(entry.name))
    return found


def await_gone(run_dirs: list[Path], timeout: float) -> float:
    """Seconds until no process of the jobs of ``run_dirs`` is left; fails after ``timeout``."""
    return _await_none(lambda: set().union(*(job_pids(d) for d in run_dirs)), timeout)


def await_reaped(pids: set[int], timeout: float = 60) -> float:
    """Seconds until every one of ``pids`` has exited and been reaped by its parent."""
    return _await_none(lambda: {pid for pid in pids if Path(f"/proc/{pid}").exists()}, timeout)


def _await_none(left: Callable[[], set[int]], timeout: float) -> float:
    start = time.monotonic()
    while True:
        alive = left()
        elapsed = time.monotonic() - start
        if not alive:
            return elapsed
        if elapsed > timeout:
            raise AssertionError(f"processes still alive after {elapsed:.1f} s: {alive}")
        time.sleep(0.02)


def await_event(
    run_dir: Path, predicate: Callable[[dict[str, Any]], bool], timeout: float = 180
) -> dict[str, Any]:
    """The first ledger event of ``run_dir`` for which ``predicate`` holds, once written."""
    path = run_dir / "ledger.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            match = next((e for e in read_ledger(path) if predicate(e)), None)
            if match is not None:
                return match
        time.sleep(0.05)
    raise AssertionError(f"no such event in {path} within {timeout:.0f} s")


@contextlib.contextmanager
def launched(command: list[str], run_dir: Path, **popen: Any) -> Iterator[subprocess.Popen]:
    """Start a launcher in its own process group, its output to ``RUN_DIR.out``; whatever
    happens, nothing of it (the launcher's group, the job's processes) is left afterwards."""
    out = run_dir.with_suffix(".out")
    with out.open("w") as sink:
        proc = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, **popen
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in job_pids(run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
