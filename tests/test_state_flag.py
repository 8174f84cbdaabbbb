"""``torchrelay run --state``: an etcd that does not answer stops the launch with one line
before anything starts; a reachable one is checked and the job runs. (Bad URLs and a closed
port are in test_bad_input.py.) The controller does not keep its state there yet."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.etcd import EtcdServer
from tests.jobs import SCRIPTS, run_job


@pytest.mark.slow  # the 2 s timeout, plus an interpreter
def test_a_paused_etcd_stops_the_launch_with_one_line(etcd: EtcdServer, tmp_path):
    etcd.pause()  # accepts connections, never answers: the check must time out, not hang
    try:
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torchrelay.cli.main",
                "run",
                "--run-dir",
                str(tmp_path / "run"),
                "--state",
                etcd.url,
                str(SCRIPTS / "mlp_train.py"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        elapsed = time.monotonic() - started
    finally:
        etcd.resume()
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"torchrelay run: --state {etcd.url}/torchrelay: etcd at 127.0.0.1:{etcd.port}: "
        "read state failed: no answer within 2 s (start etcd there, or use --state memory)"
    ]
    assert not (tmp_path / "run").exists()
    assert elapsed < 30  # the 2 s timeout plus interpreter start on a loaded machine


@pytest.mark.slow
def test_a_job_with_etcd_state_runs(etcd: EtcdServer, tmp_path):
    job = run_job(tmp_path / "run", launcher_args=("--state", f"{etcd.url}/job-1"), spares=0)
    assert job.returncode == 0, job.output
