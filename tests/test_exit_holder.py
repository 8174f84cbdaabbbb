"""The exit holder (runtime/exit_holder.py): a killed worker's end is seen -- its parent reaps
it, its peers' sockets close -- while its memory is still mapped, held by the holder, which
then exits too. Real processes; the holder is SIGSTOPped so that the order is certain."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_built
from torchrelay.runtime import exit_holder

_WORKER = """
import socket, sys, time, torch
from torchrelay.runtime import exit_holder
resident = torch.ones(64 * 2**20)  # 256 MiB, written: resident
peer = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
holder = exit_holder.start()
print(holder, flush=True)
time.sleep(3600)
"""


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _rss_mib(pid: int) -> int:
    return int(_status(pid)["VmRSS"].split()[0]) // 1024


def _wait_stopped(pid: int, timeout: float = 60.0) -> None:
    """Until ``pid`` has taken its SIGSTOP: it shows ``R`` until it next gets a CPU."""
    deadline = time.monotonic() + timeout
    while not _status(pid)["State"].startswith("T"):
        assert time.monotonic() < deadline, f"process {pid} did not stop within {timeout:g} s"
        time.sleep(0.01)


@pytest.mark.timeout(120)
def test_a_killed_worker_is_reaped_and_its_sockets_close_before_its_memory_is_unmapped():
    require_built()
    listener = socket.create_server(("127.0.0.1", 0))
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(listener.getsockname()[1])],
        stdout=subprocess.PIPE,
        env={**os.environ, exit_holder.SWITCH: "1"},
    )
    assert worker.stdout is not None
    holder_end = None
    try:
        peer, _ = listener.accept()
        peer.settimeout(60)
        holder = int(worker.stdout.readline())
        holder_end = os.pidfd_open(holder)
        assert Path(f"/proc/{holder}/comm").read_text().strip() == "torchrelay-hold"
        assert int(_status(holder)["PPid"]) == worker.pid
        assert len(os.listdir(f"/proc/{holder}/fd")) == 1  # its pidfd of the worker, no socket
        assert int(_status(holder)["SigBlk"], 16) & (1 << (signal.SIGTERM - 1))
        assert _rss_mib(holder) >= 256  # the worker's memory: one address space
        fields = Path(f"/proc/{holder}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(fields[2]) == os.getpgid(worker.pid)  # in the worker's group: killed with it
        assert int(fields[16]) == 19  # its unmapping yields to the recovery

        os.kill(holder, signal.SIGSTOP)  # it can neither exit nor unmap anything now
        _wait_stopped(holder)  # at nice 19 beside a CPU hog, it may take a while to stop
        worker.kill()
        assert worker.wait(timeout=60) == -signal.SIGKILL  # reaped
        assert peer.recv(1) == b""  # its socket closed: the peer saw the end
        assert _status(holder)["State"].startswith("T") and _rss_mib(holder) >= 256

        os.kill(holder, signal.SIGCONT)
        assert select.select([holder_end], [], [], 60)[0] == [holder_end]  # then it ends
    finally:
        worker.kill()
        worker.wait()
        listener.close()
        if holder_end is not None:  # a failed check may leave it stopped: not past the test
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(holder_end, signal.SIGKILL)
            os.close(holder_end)


def test_no_holder_unless_switched_on(monkeypatch):
    for switch in ("", "0"):
        monkeypatch.setenv(exit_holder.SWITCH, switch)
        assert exit_holder.start() is None


_ORDINARY_EXIT = """
import atexit, os
from torchrelay.runtime import exit_holder
holder = []
# Registered first, so it runs last: after the holder's own handler.
atexit.register(lambda: print("holder left", not os.path.exists(f"/proc/{holder[0]}"), flush=True))
holder.append(exit_holder.start())
print(holder[0], flush=True)
"""


def test_an_ordinary_exit_ends_and_reaps_the_holder_first():
    """Nobody waits on an ordinary exit: the worker unmaps its own memory, and no holder is
    left for init to reap (its job's end would wait for it)."""
    require_built()
    done = subprocess.run(
        [sys.executable, "-c", _ORDINARY_EXIT],
        capture_output=True,
        text=True,
        env={**os.environ, exit_holder.SWITCH: "1"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    holder, verdict = done.stdout.splitlines()
    assert int(holder) > 0 and verdict == "holder left True"
