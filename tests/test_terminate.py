"""Ending a job from outside, in-process: a terminated job is not a failed one, and a worker
that lost its controller leaves even when nobody reads its stderr any more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from tests.fsm import join_to, report_to
from torchrelay.agent.signals import exit_status
from torchrelay.config import JobConfig
from torchrelay.control.controller import Controller
from torchrelay.exits import EXIT_CONTROLLER_LOST, EXIT_FENCED
from torchrelay.ledger import Ledger, read_ledger
from torchrelay.report.summary import render_text, summarize


class IdleAgent:
    def start_spare(self) -> None:
        raise AssertionError("a terminated job starts no spare")

    def kill(self, process: str, signum: int = signal.SIGKILL, stacks: bool = False) -> None:
        raise AssertionError("a terminated job fences nobody")


def test_terminated_job_records_no_failure_and_reports_the_signal(tmp_path):
    config = JobConfig("train.py", [], nproc_per_node=2, run_dir=tmp_path, spares=1)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.record("job_start", world_size=2, spares=1, script="train.py", args=[], chaos=[])
    controller = Controller(config, ledger, IdleAgent())
    for slot in (0, 1):
        join_to(controller, f"worker{slot}", "worker", 100 + slot, "node0", slot)
    join_to(controller, "spare0", "spare", 102, "node0", None)
    report_to(controller, "worker0", "max_steps", {"generation": 0, "max_steps": 10})
    report_to(controller, "worker0", "progress", {"generation": 0, "step": 6})
    controller.terminate("SIGTERM")
    controller.terminate("SIGINT")  # the first signal decides
    # The stop itself: the agent's SIGTERM reaches them, one dies of it, one after the grace.
    controller.on_exit("worker0", -signal.SIGTERM)
    controller.on_exit("spare0", -signal.SIGTERM)
    controller.on_exit("worker1", -signal.SIGKILL)
    ledger.close()
    assert controller.outcome is not None
    assert controller.outcome["status"] == "terminated"
    events = read_ledger(tmp_path / "ledger.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds.count("job_end") == 1
    assert not {"failure", "recovery_start", "spare_lost"} & set(kinds)
    summary = summarize(tmp_path)
    assert (summary["status"], summary["signal"], summary["steps_committed"]) == (
        "terminated",
        "SIGTERM",
        7,
    )
    assert f"run {tmp_path}: terminated by SIGTERM -- " in render_text(summary)
    assert summary["failures"] == []


def test_exit_status_is_the_shells_for_a_signal():
    assert (exit_status("SIGTERM"), exit_status("SIGINT")) == (143, 130)


LEAVE = textwrap.dedent(
    """
    import os, sys, threading
    from torchrelay.control.client import ControlError
    from torchrelay.runtime.control_link import _die_on_control_error
    sys.stdin.readline()  # the test has closed the reading end of our stderr by now
    error = ControlError(sys.argv[1], "the launcher is gone")
    # On a thread, as in a worker (its watch stream): the process must end, not the thread.
    thread = threading.Thread(target=_die_on_control_error, args=(error,))
    thread.start()
    thread.join()
    os._exit(3)
    """
)


def test_a_worker_that_lost_its_controller_exits_even_with_a_broken_stderr():
    for code, status in (("UNAVAILABLE", EXIT_CONTROLLER_LOST), ("FAILED_PRECONDITION", 70)):
        proc = subprocess.Popen(
            [sys.executable, "-c", LEAVE, code],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        proc.stderr.close()  # as when the launcher that read it died
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait(timeout=120) == status
    assert status == EXIT_FENCED
