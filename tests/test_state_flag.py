"""``torchrelay run --state etcd://...`` with a real etcd: an etcd that does not answer stops
the launch with one line before anything starts; a job keeps its durable state there (sealed
with its token) and ends with it; a second launcher cannot take a running job's lead; losing
etcd mid-job stops the job, acting on nothing more, with every process gone. (Bad URLs and a
closed port are in test_bad_input.py; the write-ahead rules in test_persistence.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.etcd import EtcdServer
from tests.jobs import SCRIPTS, assert_bitwise_equal, job_command, run_job
from tests.lifecycle import await_event, await_gone, launched
from torchrelay.control.store import SealedStore
from torchrelay.control.store.etcd import EtcdBackend
from torchrelay.ledger import read_ledger


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
def test_a_job_keeps_its_state_in_etcd(etcd: EtcdServer, tmp_path, reference_weights):
    job = run_job(
        tmp_path / "run",
        launcher_args=("--state", f"{etcd.url}/job-1"),
        chaos=("kill:rank=1:step=4",),
    )
    assert job.returncode == 0, job.output
    assert_bitwise_equal(job.weights(), reference_weights(10), job)
    token = (job.run_dir / "token").read_text()
    backend = EtcdBackend("127.0.0.1", etcd.port, "job-1")
    raw, _ = SealedStore(backend, token).get_state()
    backend.close()
    assert raw is not None
    state = json.loads(raw)
    assert state["phase"] == "succeeded" and state["highest_committed"] == 9
    assert state["generation"] == 1  # the recovery's plan was recorded before it was sent
    assert state["assignments"]["1"] == "spare0"
    assert state["members"]["worker1"]["state"] == "dead"


def _held_job(run_dir, url: str) -> list[str]:
    """A job that joins and then waits at step 0 (its leash file is never written)."""
    return job_command(
        run_dir,
        launcher_args=("--state", url),
        script_args=("--leash", str(run_dir.with_suffix(".leash"))),
        spares=0,
    )


@pytest.mark.slow
def test_a_second_launcher_cannot_lead_a_running_job(etcd: EtcdServer, tmp_path):
    url = f"{etcd.url}/shared"
    first = tmp_path / "first"
    with launched(_held_job(first, url), first):
        await_event(first, lambda e: e["event"] == "process_join")
        second = subprocess.run(
            _held_job(tmp_path / "second", url), capture_output=True, text=True, timeout=120
        )
    assert second.returncode != 0 and "Traceback" not in second.stderr
    [line] = second.stderr.strip().splitlines()
    assert line.startswith(f"torchrelay run: --state {url}: ") and "did not win" in line
    assert not (tmp_path / "second").exists()


@pytest.mark.slow
def test_losing_etcd_mid_job_stops_it_acting_on_nothing_more(etcd: EtcdServer, tmp_path):
    run_dir = tmp_path / "run"
    with launched(_held_job(run_dir, f"{etcd.url}/job-2"), run_dir) as launcher:
        for slot in range(3):
            await_event(run_dir, lambda e, s=slot: e["event"] == "process_join" and e["slot"] == s)
        etcd.kill()
        returncode = launcher.wait(timeout=120)
        await_gone([run_dir], timeout=60)
    output = run_dir.with_suffix(".out").read_text()
    assert returncode == 1, output
    [end] = [e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "job_end"]
    assert end["status"] == "failed"
    assert end["reason"].startswith("the job state could not be recorded (")
    assert "torchrelay: job failed: the job state could not be recorded" in output
