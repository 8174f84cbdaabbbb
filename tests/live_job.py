"""A real controller behind the real control RPC, without processes: what operators' commands
(``status``, ``chaos``) talk to in fast tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from torchrelay.config import JobConfig
from torchrelay.control.client import ControlClient
from torchrelay.control.controller import Controller
from torchrelay.control.service import ControlServer
from torchrelay.control.wire import new_token
from torchrelay.ledger import Ledger


class RecordingAgent:
    """Stands in for the node agent: records the signals the controller asks it to send."""

    def __init__(self) -> None:
        self.signals: list[tuple[str, int]] = []

    def start_spare(self) -> None:
        pass

    def kill(self, process: str, signum: int = 9, stacks: bool = False) -> None:
        self.signals.append((process, signum))


@dataclass
class LiveJob:
    run_dir: Path
    agent: RecordingAgent
    controller: Controller
    server: ControlServer
    ledger: Ledger
    answered: int = 0  # status requests answered so far
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def count_status(self) -> None:
        with self._changed:
            self.answered += 1
            self._changed.notify_all()

    def answered_status(self, times: int, timeout: float = 60.0) -> bool:
        """Wait until the controller has answered ``times`` status requests in all."""
        with self._changed:
            return self._changed.wait_for(lambda: self.answered >= times, timeout)


@pytest.fixture
def live_job(tmp_path):
    """worker0 joined; the run directory holds the `endpoint` and `token` files an operator's
    command finds the job by. Every status the controller answers is counted."""
    config = JobConfig(script="train.py", script_args=[], nproc_per_node=1, run_dir=tmp_path)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = RecordingAgent()
    token = new_token()
    controller = Controller(config, ledger, agent)
    server = ControlServer(controller, token)
    job = LiveJob(tmp_path, agent, controller, server, ledger)
    status = controller.status

    def counted() -> dict[str, Any]:
        snapshot = status()
        job.count_status()
        return snapshot

    controller.status = counted  # type: ignore[method-assign]
    server.start()
    (tmp_path / "token").write_text(token)
    (tmp_path / "endpoint").write_text(server.address)
    worker = ControlClient(server.address, token, "worker0")
    worker.join("worker", 12345, "node0", 0)
    yield job
    worker.close()
    server.stop()
    ledger.close()
