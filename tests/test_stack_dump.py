"""Stack dumps before a fence (torchrelay.stack_dump): a real process that registered is asked
for its stacks and fenced once they have come through its output; one that cannot dump (no
compiled extension; stopped) is fenced at once. Paced by the process's output and exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from tests.conftest import require_built
from torchrelay.agent.stack_dump import StackDumps, dumps_on_request
from torchrelay.runtime.native import SWITCH
from torchrelay.stack_dump import END

# The main thread blocks for good in a frame whose name the dump must show, holding nothing;
# a second thread spins in Python, so the dump is taken while another thread runs.
_WORKER = """
import threading
from torchrelay.runtime import stack_dump

def spin_beside_it():
    while True:
        sum(range(1000))

def stuck_in_a_named_frame():
    threading.Thread(target=spin_beside_it, daemon=True).start()
    print("registered" if stack_dump.register() else "not registered", flush=True)
    threading.Event().wait()

stuck_in_a_named_frame()
"""


class _Worker:
    """The process, its output read line by line into ``lines`` and into ``dumps``."""

    def __init__(self, dumps: StackDumps, native: bool) -> None:
        env = {**os.environ, SWITCH: "1" if native else "0"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline()
        self.lines: list[bytes] = []
        self.fenced_after: list[bytes] | None = None
        threading.Thread(target=self._pump, args=(dumps,), daemon=True).start()

    def _pump(self, dumps: StackDumps) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.append(raw)
            dumps.read("w", raw)

    def fence(self) -> None:
        self.fenced_after = list(self.lines)
        os.killpg(self.proc.pid, signal.SIGKILL)


def _registered() -> tuple[StackDumps, _Worker]:
    require_built()
    dumps = StackDumps()
    worker = _Worker(dumps, native=True)
    assert worker.first == b"registered\n"
    return dumps, worker


@pytest.mark.timeout(120)
def test_fence_waits_for_every_threads_stack_then_kills():
    dumps, worker = _registered()
    assert dumps_on_request(worker.proc.pid)
    dumps.fence_after_dump("w", worker.proc.pid, worker.fence)
    assert worker.proc.wait() == -signal.SIGKILL
    dumped = b"".join(worker.fenced_after or [])
    # Fenced only once the end line was out, with both threads' stacks before it.
    assert dumped.endswith(END)
    assert b"in stuck_in_a_named_frame" in dumped
    assert b"in spin_beside_it" in dumped
    assert dumped.count(b"(most recent call first)") >= 2


@pytest.mark.timeout(120)
def test_worker_without_the_extension_is_fenced_at_once():
    dumps = StackDumps()
    worker = _Worker(dumps, native=False)
    assert worker.first == b"not registered\n"
    assert not dumps_on_request(worker.proc.pid)
    dumps.fence_after_dump("w", worker.proc.pid, worker.fence)
    assert worker.fenced_after is not None  # on the caller's thread, before returning
    assert worker.proc.wait() == -signal.SIGKILL
    assert END not in b"".join(worker.lines)


@pytest.mark.timeout(120)
def test_stopped_worker_is_fenced_at_once():
    dumps, worker = _registered()
    os.kill(worker.proc.pid, signal.SIGSTOP)
    _, status = os.waitpid(worker.proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status)
    assert not dumps_on_request(worker.proc.pid)
    dumps.fence_after_dump("w", worker.proc.pid, worker.fence)
    assert worker.fenced_after is not None
    assert worker.proc.wait() == -signal.SIGKILL


def test_process_that_is_gone_is_not_asked():
    assert not dumps_on_request(2**22 + 12345)  # above pid_max's default: no such process
