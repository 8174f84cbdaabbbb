"""A real, throwaway etcd for tests and benchmarks: one member on free loopback ports.

:func:`start_etcd` starts Debian's ``etcd`` (scripts/setup.sh installs it) with a temporary
data directory in its own process group, and returns once ``/health`` answers (a safety
timeout only); :meth:`EtcdServer.kill` kills the whole group. The ``etcd`` fixture skips
when the binary is missing, and fails under ``CI=true``, which must provide it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class EtcdServer:
    """A running etcd member: ``url`` is what ``--state`` takes."""

    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    def pause(self) -> None:
        """SIGSTOP: the socket still accepts connections, nothing answers (a partition)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def start_etcd(data_dir: Path, fast_election: bool = True) -> EtcdServer:
    """Start etcd in ``data_dir``; return once it is healthy (or raise with its log's tail).

    ``fast_election`` shortens raft's heartbeat and election timeout (one member elects itself
    sooner, and etcd's minimum lease TTL drops from 2 s to 1 s).
    """
    binary = etcd_binary()
    assert binary, "etcd is not installed (bash scripts/setup.sh installs etcd-server)"
    data_dir.mkdir(parents=True, exist_ok=True)
    client, peer = free_port(), free_port()
    log = data_dir / "etcd.log"
    command = [
        binary,
        "--name=t",
        f"--data-dir={data_dir / 'data'}",
        f"--listen-client-urls=http://127.0.0.1:{client}",
        f"--advertise-client-urls=http://127.0.0.1:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=t=http://127.0.0.1:{peer}",
    ]
    if fast_election:
        command += ["--heartbeat-interval=20", "--election-timeout=200"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = EtcdServer(proc, client, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                if b'"true"' in r.read():
                    return server
        except OSError:
            time.sleep(0.05)  # not listening yet; the next try is the event check
    server.kill()
    tail = log.read_text(errors="replace")[-2000:]
    raise AssertionError(f"etcd did not become healthy (exit {proc.returncode}):\n{tail}")


def require_etcd() -> None:
    """Skip the calling test when etcd is missing, except under CI=true (then fail)."""
    if etcd_binary() is None:
        message = "etcd is not installed (bash scripts/setup.sh installs etcd-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def etcd(tmp_path):
    """A fresh etcd for one test, killed (process group) afterwards."""
    require_etcd()
    server = start_etcd(tmp_path / "etcd")
    try:
        yield server
    finally:
        server.kill()
