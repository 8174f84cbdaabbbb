"""`torchrelay status` and `torchrelay chaos` against a running job: faults injected from
outside (a real SIGKILL and a real SIGSTOP) are cured, and the weights stay bitwise equal."""

from __future__ import annotations

import subprocess

import pytest

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_status,
    cli,
    job_command,
    move_leash,
)

pytestmark = pytest.mark.slow
STEPS = 60


def recovered(generation: int):
    """Status predicate: recovered into ``generation``, and the spare pool refilled."""
    return lambda s: s["generation"] >= generation and not s["recovering"] and len(s["spares"]) == 1


def test_operator_kill_and_hang_are_cured(tmp_path, reference_weights):
    # The job runs on a leash the test moves after each drill, so every drill lands on a
    # running job however slow the machine is (a fixed job length raced the test before).
    run_dir, leash = tmp_path / "run", tmp_path / "leash"
    move_leash(leash, 20)
    launcher = subprocess.Popen(
        job_command(
            run_dir,
            steps=STEPS,
            launcher_args=("--hang-floor", "2"),
            script_args=("--leash", str(leash)),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        await_status(run_dir, lambda s: s["steps_committed"] >= 19 and len(s["spares"]) == 1)
        shown = cli("status", str(run_dir))
        assert shown.returncode == 0 and "worker1" in shown.stdout

        killed = cli("chaos", "--run-dir", str(run_dir), "kill", "--rank", "1")
        assert "sent SIGKILL to worker1" in killed.stdout
        move_leash(leash, 30)  # a recovery is done once a step is committed after it
        await_status(run_dir, recovered(1))
        hung = cli("chaos", "--run-dir", str(run_dir), "hang", "--rank", "2")
        assert "sent SIGSTOP to worker2" in hung.stdout
        move_leash(leash, 40)
        await_status(run_dir, recovered(2))
        spare = cli("chaos", "--run-dir", str(run_dir), "kill-spare")
        assert "sent SIGKILL to spare" in spare.stdout
        await_status(
            run_dir,
            lambda s: len(s["spares"]) == 1 and s["spares"][0]["process"] not in spare.stdout,
        )
        assert launcher.poll() is None  # every drill hit a running job
        move_leash(leash, STEPS)
        output, _ = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output
    job = JobResult(launcher.returncode, output, run_dir)
    summary = job.summary()
    assert [f["cause"] for f in summary["failures"]] == ["SIGKILL", "SIGKILL"]
    assert "heartbeat silent" in summary["failures"][1]["detected_by"]
    assert all(f["recovered"] and f["lost_steps"] == 0 for f in summary["failures"])
    assert any(e["event"] == "spare_lost" for e in job.ledger())  # and the pool refilled
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))


def test_chaos_without_a_running_job_says_so(tmp_path):
    done = cli("chaos", "--run-dir", str(tmp_path), "kill", "--rank", "0")
    assert done.returncode != 0 and "no running job" in done.stderr
