"""The node agent in transparent mode (real CRIU): a worker parked at a step boundary is cloned
into a new job process or migrated in place, and each copy is supervised like any other --
its output logged and prefixed under its own name, its exit reported once, its signals
delivered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import procs
from tests.jobs import SCRIPTS
from tests.snapshots import require_criu
from torchrelay.agent.agent import NodeAgent
from torchrelay.config import JobConfig
from torchrelay.transparent import nsinit
from torchrelay.transparent.launch import worker_command
from torchrelay.transparent.park import Instruction, Kind

pytestmark = pytest.mark.slow


class Exits:
    """The exits an agent reports, for a test to wait on (an event, not a sleep)."""

    def __init__(self) -> None:
        self.codes: dict[str, list[int]] = {}
        self._changed = threading.Condition()

    def __call__(self, process: str, code: int) -> None:
        with self._changed:
            self.codes.setdefault(process, []).append(code)
            self._changed.notify_all()

    def wait(self, processes: set[str], timeout: float = 120) -> dict[str, list[int]]:
        with self._changed:
            assert self._changed.wait_for(lambda: processes <= set(self.codes), timeout)
            return dict(self.codes)


def _agent(run_dir: Path, *args: str) -> tuple[NodeAgent, Exits]:
    config = JobConfig(
        str(SCRIPTS / "park_toy.py"),
        list(args),
        nproc_per_node=1,
        run_dir=run_dir,
        transparent=True,
    )
    exits = Exits()
    agent = NodeAgent(config, "node0", on_exit=exits)
    agent.configure(1, "127.0.0.1:1", "agent-test-token")
    return agent, exits


def test_clone_is_a_job_process_of_its_own(tmp_path: Path, capfd) -> None:
    require_criu()
    agent, exits = _agent(tmp_path, "6", "3")
    try:
        agent.start_workers()
        agent.parked("worker0")
        copy = agent.clone("worker0", "spare0")
        assert copy.bytes > 0
        agent.instruct("spare0", Instruction(Kind.BECOME, 2, slot=4))
        agent.instruct("worker0", Instruction(Kind.CONTINUE, 2))
        codes = exits.wait({"worker0", "spare0"})
    finally:
        agent.kill_all()
    assert codes == {"worker0": [0], "spare0": [4]}
    clone_log = (tmp_path / "logs" / "spare0.log").read_text().splitlines()
    donor_log = (tmp_path / "logs" / "worker0.log").read_text().splitlines()
    assert clone_log[0] == "instruction become 4"
    assert clone_log[1:] == donor_log[4:], "the clone goes on where the donor parked"
    assert "[spare0]:instruction become 4" in capfd.readouterr().out


def test_migration_keeps_the_name_and_reports_one_exit(tmp_path: Path) -> None:
    require_criu()
    agent, exits = _agent(tmp_path, "6", "3")
    try:
        agent.start_workers()
        agent.parked("worker0")
        agent.migrate("worker0")
        agent.instruct("worker0", Instruction(Kind.BECOME, 2, slot=5))
        codes = exits.wait({"worker0"})
    finally:
        agent.kill_all()
    assert codes == {"worker0": [5]}, "the original's death by the dump is not a failure"
    log = (tmp_path / "logs" / "worker0.log").read_text().splitlines()
    assert [line.split()[1] for line in log if line.startswith("step")] == [
        str(i) for i in range(6)
    ]


def test_stop_reaches_a_clone(tmp_path: Path) -> None:
    require_criu()
    agent, exits = _agent(tmp_path, "100000", "1", "0.05")
    try:
        agent.start_workers()
        agent.parked("worker0")
        agent.clone("worker0", "spare0")
        agent.instruct("spare0", Instruction(Kind.BECOME, 2, slot=1))
        agent.instruct("worker0", Instruction(Kind.CONTINUE, 2))
        started = time.monotonic()
        agent.stop_all(grace=60)
        codes = exits.wait({"worker0", "spare0"})
    finally:
        agent.kill_all()
    assert time.monotonic() - started < 60, "SIGTERM, not the SIGKILL after the grace"
    assert codes["worker0"] == [-signal.SIGTERM]
    assert codes["spare0"] == [-signal.SIGTERM], codes


def _tree(outer: int) -> nsinit.Tree | None:
    try:
        return nsinit.tree(outer)
    except OSError:
        return None  # not started yet


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait for a state (polled; the timeout is a safety net, never the pace)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_hang_drill_stops_the_worker_and_its_fence_ends_its_namespace(tmp_path: Path) -> None:
    """The worker runs under an nsinit outer, in a PID namespace of its own: SIGSTOP (which no
    handler can forward) still reaches the worker, and the SIGKILL of its outer ends it all."""
    agent, exits = _agent(tmp_path, "100000", "-1", "0.05")
    try:
        agent.start_workers()
        outer = agent.pid("worker0")
        assert outer is not None
        _until(lambda: _tree(outer) is not None, "no worker started")
        tree = nsinit.tree(outer)
        agent.kill("worker0", signal.SIGSTOP)
        _until(lambda: procs.state(tree.worker) == "T", "the worker was not stopped")
        assert procs.state(tree.init) != "T", "its init stays awake"
        agent.kill("worker0")  # the fence
        codes = exits.wait({"worker0"})
        _until(
            lambda: procs.state(tree.init) in "XZ" and procs.state(tree.worker) in "XZ",
            "left behind",
        )
    finally:
        agent.kill_all()
    assert codes == {"worker0": [-signal.SIGKILL]}


def test_a_worker_reports_the_pid_its_node_sees(tmp_path: Path) -> None:
    """In its own PID namespace a worker is PID 2; what it reports (``host_pid``, the pid of
    ``torchrelay status``) is the node's PID of the same process."""
    code = (
        "import os, sys\n"
        "from torchrelay.runtime.env import host_pid\n"
        "print(os.getpid(), host_pid(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    worker = subprocess.Popen(
        worker_command([sys.executable, "-c", code]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,
    )
    try:
        assert worker.stdout is not None and worker.stdin is not None
        own, reported = worker.stdout.readline().split()
        assert (int(own), int(reported)) == (2, nsinit.tree(worker.pid).worker)
        worker.stdin.close()
        assert worker.wait(timeout=60) == 0
    finally:
        worker.kill()
        worker.wait()
