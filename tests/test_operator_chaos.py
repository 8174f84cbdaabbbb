"""`torchrelay status` and `torchrelay chaos` against a running job: faults injected from
outside (a real SIGKILL and a real SIGSTOP) are cured, and the weights stay bitwise equal."""

from __future__ import annotations

import subprocess

import pytest

from tests.jobs import JobResult, assert_bitwise_equal, await_status, cli, job_command

pytestmark = pytest.mark.slow
STEPS = 60


def test_operator_kill_and_hang_are_cured(tmp_path, reference_weights):
    run_dir, release = tmp_path / "run", tmp_path / "release"
    launcher = subprocess.Popen(
        job_command(
            run_dir,
            steps=STEPS,
            # rank 0 computes 50 ms longer per step, so the drills usually land mid-run; but
            # however slow the machine, the job waits in its last step until the test is done
            chaos=("slow:rank=0:step=0:seconds=0.05",),
            launcher_args=("--hang-floor", "2"),
            script_args=("--hold-step", str(STEPS - 1), "--hold-file", str(release)),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = lambda s: s["steps_committed"] >= 20 and len(s["spares"]) == 1  # noqa: E731
        await_status(run_dir, ready)
        shown = cli("status", str(run_dir))
        assert shown.returncode == 0 and "worker1" in shown.stdout

        killed = cli("chaos", "--run-dir", str(run_dir), "kill", "--rank", "1")
        assert "sent SIGKILL to worker1" in killed.stdout
        await_status(
            run_dir,
            lambda s: s["generation"] >= 1 and not s["recovering"] and len(s["spares"]) == 1,
        )
        hung = cli("chaos", "--run-dir", str(run_dir), "hang", "--rank", "2")
        assert "sent SIGSTOP to worker2" in hung.stdout
        await_status(
            run_dir,
            lambda s: s["generation"] >= 2 and not s["recovering"] and len(s["spares"]) == 1,
        )
        spare = cli("chaos", "--run-dir", str(run_dir), "kill-spare")
        assert "sent SIGKILL to spare" in spare.stdout
        await_status(
            run_dir,
            lambda s: len(s["spares"]) == 1 and s["spares"][0]["process"] not in spare.stdout,
        )
        assert launcher.poll() is None  # held: every drill hit a running job
        release.touch()
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
