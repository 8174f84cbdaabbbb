"""`torchrelay run ... | head`: the reader of the launcher's output leaves mid-job.

The agent streams each worker's output to the launcher's stdout and into RUN_DIR/logs. When
that stdout is a pipe whose reader has gone, streaming stops but draining does not: otherwise
the worker would block on a full pipe (and be fenced as a stall, again and again).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.jobs import job_command, move_leash


def await_joined(run_dir: Path, processes: list[str], launcher: subprocess.Popen) -> None:
    """Until every one of ``processes`` has joined the job (they then wait on the leash)."""
    deadline = time.monotonic() + 240  # a safety net only: the event is what we wait for
    while time.monotonic() < deadline and launcher.poll() is None:
        ledger = run_dir / "ledger.jsonl"
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        joined = {json.loads(line).get("process") for line in lines if "process_join" in line}
        if joined >= set(processes):
            return
        time.sleep(0.1)
    raise AssertionError(f"{processes} did not join (launcher exit {launcher.poll()})")


@pytest.mark.slow
def test_a_closed_stdout_stops_streaming_but_the_job_runs_on(tmp_path):
    run_dir = tmp_path / "run"
    leash = tmp_path / "leash"
    move_leash(leash, 0)  # hold every rank in step 0 until the reader has left
    command = [
        arg for arg in job_command(run_dir, nproc=2, spares=0, steps=6) if arg != "--quiet"
    ] + ["--leash", str(leash), "--print-steps"]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert launcher.stdout is not None
        await_joined(run_dir, ["worker0", "worker1"], launcher)
        launcher.stdout.close()  # the reader leaves (as `| head -1` does)
        move_leash(leash, 10**6)
        launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    ledger = (run_dir / "ledger.jsonl").read_text()
    assert '"event": "job_end", "status": "succeeded"' in ledger
    # Every line written after the reader left still reached the logs.
    log = (run_dir / "logs" / "worker0.log").read_text()
    assert "step 5 loss" in log and "final loss" in log
