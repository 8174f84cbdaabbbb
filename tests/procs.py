"""A process as ``/proc`` shows it, for the tests that check which processes are left."""

from __future__ import annotations

import time
from pathlib import Path


def state(pid: int) -> str:
    """Its state letter (``R``, ``S``, ``T``, ``Z``...); ``X`` once it has no entry left."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def gone(pid: int) -> bool:
    """Whether it has exited (a zombie not reaped yet holds nothing any more)."""
    return state(pid) in ("Z", "X")


def await_gone(pid: int, timeout: float = 30.0) -> bool:
    """Whether ``pid`` (not necessarily our child) exits within ``timeout``, a failsafe: the
    wait ends at its exit."""
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
