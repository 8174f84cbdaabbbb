"""The node agent hands each process a device index (LOCAL_RANK): workers their own, spares
the lowest one no live process holds -- so a spare never shares a GPU with a live worker."""

from __future__ import annotations

import threading

from tests.jobs import printed_lines
from torchrelay.agent.agent import NodeAgent
from torchrelay.config import JobConfig


def _local_ranks(agent: NodeAgent, processes: list[str]) -> dict[str, int]:
    """What each process printed as its LOCAL_RANK, once all of them have printed it."""
    return {p: int(line) for p, line in printed_lines(agent.log_dir, processes).items()}


def test_spares_take_the_lowest_free_device_index(tmp_path):
    script = tmp_path / "idle.py"
    script.write_text("import os, signal\nprint(os.environ['LOCAL_RANK'])\nsignal.pause()\n")
    exited = threading.Event()
    config = JobConfig(
        str(script), [], nproc_per_node=2, run_dir=tmp_path, console_ranks=frozenset()
    )
    agent = NodeAgent(config, "node0", on_exit=lambda process, code: exited.set())
    agent.configure(1, "127.0.0.1:1", "token")
    try:
        agent.start_workers()
        agent.start_spare()
        agent.start_spare()
        first = ["worker0", "worker1", "spare0", "spare1"]
        assert _local_ranks(agent, first) == {"worker0": 0, "worker1": 1, "spare0": 2, "spare1": 3}
        agent.kill("worker1")
        assert exited.wait(timeout=30)
        agent.start_spare()  # the dead worker's index is the lowest free one
        assert _local_ranks(agent, ["spare2"]) == {"spare2": 1}
    finally:
        agent.kill_all()
