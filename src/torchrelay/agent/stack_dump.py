"""The node agent's side of :mod:`torchrelay.stack_dump`: a fence that asks for stacks first.

Contract: :meth:`StackDumps.fence_after_dump` sends the worker the dump signal and fences it
(the caller's ``fence``, a SIGKILL of its group) once the dump's end line has come through its
output (:meth:`StackDumps.read`, called by the agent's pump for every line). It fences at once,
with no dump, a worker that does not catch the signal (no compiled extension; not joined yet;
transparent mode's outer process) or that is stopped (it could not run the handler).

Failure behaviour: a fence never waits on the dump for more than :data:`DUMP_BOUND` seconds
(a worker that stopped or lost its stderr mid-dump), and never blocks the caller: the wait is
on a thread of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from torchrelay.stack_dump import END, SIGNAL

DUMP_BOUND = 10.0


class StackDumps:
    """The dumps this node's agent has asked for and not yet seen end; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: dict[str, threading.Event] = {}

    def read(self, process: str, line: bytes) -> None:
        """A line of ``process``'s output: the end of its dump releases its fence."""
        if not line.endswith(END):
            return
        with self._lock:
            ended = self._ends.get(process)
        if ended is not None:
            ended.set()

    def fence_after_dump(self, process: str, pid: int, fence: Callable[[], None]) -> None:
        """Ask ``process`` (``pid``) for its stacks, then ``fence`` it (module doc)."""
        if not dumps_on_request(pid):
            fence()
            return
        ended = threading.Event()
        with self._lock:
            self._ends[process] = ended
        try:
            os.kill(pid, SIGNAL)
        except ProcessLookupError:
            ended.set()

        def fence_when_dumped() -> None:
            ended.wait(DUMP_BOUND)
            with self._lock:
                self._ends.pop(process, None)
            fence()

        threading.Thread(target=fence_when_dumped, name="torchrelay-stacks", daemon=True).start()


def dumps_on_request(pid: int) -> bool:
    """Whether ``pid`` is running (not stopped) and catches :data:`SIGNAL`."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    if fields.get("State", "T").startswith(("T", "t", "Z", "X")):
        return False
    caught = int(fields.get("SigCgt", "0"), 16)
    return bool(caught >> (SIGNAL - 1) & 1)
