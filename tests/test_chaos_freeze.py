"""The chaos ``freeze`` (runtime/chaos_inject.py) stays frozen through signals: the fence's
stack dump is a signal, and a frozen worker that it woke ran on to the end of its training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import procs

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent(
    """
    import faulthandler, signal
    from torchrelay.runtime.chaos_inject import freeze
    faulthandler.register(signal.SIGUSR1)  # the stack dump the fence asks for, as a worker has it
    print("freezing", flush=True)
    freeze()
    print("woke", flush=True)
    """
)


def _blocked(pid: int) -> bool:
    """Asleep in the kernel (the freeze's wait)."""
    return procs.state(pid) == "S"


def _await(condition, what: str) -> None:
    deadline = time.monotonic() + 60  # a failsafe only: each wait ends on an event
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.005)


def test_a_frozen_process_stays_frozen_after_a_signal_it_handles():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        assert child.stdout.readline() == b"freezing\n"
        _await(lambda: _blocked(child.pid), "in the freeze's wait")
        os.kill(child.pid, signal.SIGUSR1)
        dump = b""
        while b"in <module>" not in dump:  # the handler ran: the frozen frame is in its dump
            line = child.stderr.readline()
            assert line, f"the child ended: {dump!r}"
            dump += line
        # Back in the wait once the handler returned -- or ended (a sleep() did, then the
        # child printed "woke" and exited).
        _await(lambda: child.poll() is not None or _blocked(child.pid), "settled")
        assert child.poll() is None, child.stdout.read()
    finally:
        child.kill()
        rest, _ = child.communicate()
    assert rest == b""
