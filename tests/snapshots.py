"""Helpers for the transparent-mode snapshot tests: a worker started with a park channel, the
way a transparent-mode agent starts one, and the CRIU requirement."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.jobs import SCRIPTS
from torchrelay.agent.spawn import spawn
from torchrelay.transparent import criu
from torchrelay.transparent.cloner import Parked
from torchrelay.transparent.launch import worker_command
from torchrelay.transparent.park import Channel

TOKEN = "snapshot-test-token"


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    channel: Channel

    def park(self) -> Parked:
        """Wait until the worker parks (an event: its sealed notice), and return it parked."""
        return Parked(self.process.pid, self.channel, self.channel.wait_parked(TOKEN))


def start_worker(
    script: str, *args: str, token: str = TOKEN, own_pid_namespace: bool = True
) -> Worker:
    """Start ``tests/scripts/SCRIPT ARGS`` as a job process with a park channel, under
    :mod:`nsinit` in a PID namespace of its own as the agent does (``own_pid_namespace``: not
    needed to test the park protocol alone, which then runs without root); its stdout and
    stderr merged on one pipe, like the agent's workers."""
    channel = Channel.open()
    env = {**os.environ, "TORCHRELAY_TOKEN": token, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-u", str(SCRIPTS / script), *args]
    process = spawn(
        worker_command(command) if own_pid_namespace else command,
        env={**env, **channel.environment()},
        pass_fds=channel.child_fds,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    channel.close_child_ends()
    return Worker(process, channel)


def output(process: subprocess.Popen[bytes], timeout: float = 120) -> tuple[list[str], int]:
    """A process's output lines and exit status, once it exits."""
    out, _ = process.communicate(timeout=timeout)
    return out.decode().splitlines(), process.returncode


def require_criu() -> criu.Criu:
    """The CRIU to test with; skip without one, except under CI=true (then fail)."""
    try:
        return criu.find_criu()
    except criu.CriuUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}; CI must provide it (scripts/setup.sh runs setup_criu.sh)")
        pytest.skip(str(exc))
