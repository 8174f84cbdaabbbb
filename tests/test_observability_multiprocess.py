"""A real job with two kills, watched the three ways an operator can: its Prometheus endpoint
agrees with its ledger (failures, recoveries, the recovery-time histogram), `status --once`
shows the new generation, and `status --watch` follows it to its end and exits 0."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.etcd import free_port
from tests.jobs import await_status, cli, job_command, move_leash
from torchrelay.events import Failure, RecoveryDone, read_events

pytestmark = pytest.mark.slow
STEPS = 40
HELD_AT = 30  # the job waits here (the leash) until the test has scraped
LIVE = (("path", "live"),)


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_for(what: str, found, timeout: float = 240.0):
    """Poll ``found()`` until it returns something truthy; the timeout is a safety net."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never saw {what}")


def test_metrics_and_status_follow_a_job_with_two_kills(tmp_path):
    run_dir, leash, port = tmp_path / "run", tmp_path / "leash", free_port()
    move_leash(leash, HELD_AT)
    launcher = subprocess.Popen(
        job_command(
            run_dir,
            steps=STEPS,
            chaos=("kill:rank=1:step=3", "kill:rank=2:step=8:phase=backward"),
            launcher_args=("--metrics-port", str(port)),
            script_args=("--leash", str(leash)),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watcher = None
    try:
        await_status(run_dir, lambda s: True)  # its controller answers
        watcher = subprocess.Popen(
            [sys.executable, "-m", "torchrelay.cli.main", "status", str(run_dir), "--watch"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ledger = run_dir / "ledger.jsonl"

        def recovered() -> list[RecoveryDone]:
            done = [e for e in read_events(ledger, strict=False) if isinstance(e, RecoveryDone)]
            return done if len(done) == 2 else []

        def counted() -> dict | None:
            sampled = scrape(port)
            return sampled if sampled[("torchrelay_recoveries_total", LIVE)] == 2 else None

        recoveries = wait_for("two recovery_done events", recovered)
        # The executor counts an event right after writing it: wait for the counts to catch up.
        metrics = wait_for("two recoveries counted", counted)
        assert launcher.poll() is None  # scraped while the job runs
        failures = [e for e in read_events(ledger) if isinstance(e, Failure)]
        assert [f.kind for f in failures] == ["signal", "signal"]
        assert metrics[("torchrelay_failures_total", (("kind", "signal"),))] == 2
        assert metrics[("torchrelay_recovery_seconds_count", ())] == 2
        assert metrics[("torchrelay_recovery_seconds_sum", ())] == pytest.approx(
            sum(r.recovery_seconds for r in recoveries), rel=1e-9
        )
        assert metrics[("torchrelay_steps_lost_total", ())] == sum(r.lost_steps for r in recoveries)
        assert metrics[("torchrelay_transfer_bytes_total", ())] == sum(
            r.bytes_transferred for r in recoveries
        )
        assert metrics[("torchrelay_generation", ())] == 2

        shown = cli("status", str(run_dir), "--once")
        assert shown.returncode == 0 and "generation 2" in shown.stdout, shown.stderr
        assert "recovery_done" in shown.stdout  # among the recent events

        move_leash(leash, STEPS)
        output, _ = launcher.communicate(timeout=300)
        watched, problems = watcher.communicate(timeout=60)
    finally:
        launcher.kill()
        if watcher is not None:
            watcher.kill()
    assert launcher.returncode == 0, output
    assert watcher.returncode == 0, problems
    assert "generation 2" in watched
    assert (
        watched.strip()
        .splitlines()[-1]
        .startswith(f"torchrelay: the job ended: succeeded, {STEPS} steps committed")
    )
    with pytest.raises(OSError):  # the endpoint lives as long as the job
        scrape(port)
