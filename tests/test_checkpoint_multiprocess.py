"""The last resort with real processes: the whole job (launcher and every worker) SIGKILLed
mid-run comes back with ``torchrelay run --resume`` from its newest durable checkpoint; the
replayed steps are identical, so the final weights equal the failure-free run bit for bit, and
the ledger counts the steps replayed. A corrupt newest checkpoint is reported and the one
before it is used; a checkpoint of another world size is refused, touching nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.jobs import assert_bitwise_equal, job_command, move_leash, run_job
from torchrelay import checkpoints as layout

pytestmark = pytest.mark.slow
STEPS = 16
HELD_AT = 12  # the job is killed while step 12 waits on the leash: steps 0..11 committed
EVERY = 5  # checkpoints after steps 4 and 9


def ledger_events(run_dir: Path) -> list[dict]:
    try:
        lines = (run_dir / "ledger.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    return events


def await_ledger(run_dir: Path, proc: subprocess.Popen, predicate, timeout: float = 180) -> None:
    """Wait until an event of the ledger satisfies ``predicate`` (the job must still run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(predicate(e) for e in ledger_events(run_dir)):
            return
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)
    raise AssertionError(f"the ledger never showed the expected event: {ledger_events(run_dir)}")


def await_gone(pids: list[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes {alive} outlived their launcher")


def command(tmp_path: Path, *extra: str, nproc: int = 3) -> list[str]:
    return job_command(
        tmp_path / "run",
        nproc=nproc,
        steps=STEPS,
        launcher_args=(
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--checkpoint-every",
            str(EVERY),
            *extra,
        ),
        script_args=("--leash", str(tmp_path / "leash")),
    )


def kill_whole_job(tmp_path: Path) -> None:
    """Run the job until step HELD_AT waits with both checkpoints written, then SIGKILL the
    launcher's process group and wait until every process of the job is gone."""
    move_leash(tmp_path / "leash", HELD_AT)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        command(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        await_ledger(run_dir, proc, lambda e: e["event"] == "checkpoint" and e["step"] == 9)
        await_ledger(run_dir, proc, lambda e: e["event"] == "progress" and e["step"] == HELD_AT - 1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    # The workers die with their launcher (parent-death signal).
    await_gone([e["pid"] for e in ledger_events(run_dir) if e["event"] == "process_join"])
    assert not any(e["event"] == "job_end" for e in ledger_events(run_dir))


def resume(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    move_leash(tmp_path / "leash", STEPS)
    return subprocess.run(
        command(tmp_path, "--resume"), capture_output=True, text=True, timeout=300
    )


def test_a_killed_job_resumes_from_its_checkpoint_bitwise_equal(tmp_path, reference_weights):
    kill_whole_job(tmp_path)
    done = resume(tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    weights = __import__("torch").load(tmp_path / "run" / "final.pt", weights_only=True)
    assert_bitwise_equal(weights, reference_weights(STEPS))

    events = ledger_events(tmp_path / "run")
    assert sum(e["event"] == "job_start" for e in events) == 1  # one job, one ledger
    (resumed,) = [e for e in events if e["event"] == "resumed"]
    assert resumed["from_step"] == 9 and resumed["last_committed"] == HELD_AT - 1
    assert resumed["steps_replayed"] == HELD_AT - 1 - 9 and resumed["skipped"] == []
    assert resumed["checkpoint"].endswith("step-9")
    report = subprocess.run(
        [*command(tmp_path)[:3], "report", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "succeeded" in report and "from checkpoint step 9" in report
    assert f"{HELD_AT - 1 - 9} step(s) replayed, not zero-loss" in report
    # The resumed job went on checkpointing; the newest two are kept.
    assert layout.complete_steps(tmp_path / "ckpt") == [14, 9]


def test_a_corrupt_newest_checkpoint_is_reported_and_the_one_before_used(
    tmp_path, reference_weights
):
    kill_whole_job(tmp_path)
    newest = layout.step_dir(tmp_path / "ckpt", 9) / "part-0"
    data = next(p for p in newest.iterdir() if p.suffix == ".distcp")
    data.write_bytes(data.read_bytes()[:100])  # truncated

    # Another world size: refused in one line, nothing touched.
    ledger_before = (tmp_path / "run" / "ledger.jsonl").read_bytes()
    wrong = subprocess.run(
        command(tmp_path, "--resume", nproc=2), capture_output=True, text=True, timeout=120
    )
    assert wrong.returncode != 0 and "world size 3, this one has 2" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    assert (tmp_path / "run" / "ledger.jsonl").read_bytes() == ledger_before

    done = resume(tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "step-9" in output and "has 100 bytes" in output  # the corruption, in one line
    weights = __import__("torch").load(tmp_path / "run" / "final.pt", weights_only=True)
    assert_bitwise_equal(weights, reference_weights(STEPS))
    (resumed,) = [e for e in ledger_events(tmp_path / "run") if e["event"] == "resumed"]
    assert resumed["from_step"] == 4 and resumed["steps_replayed"] == HELD_AT - 1 - 4
    assert len(resumed["skipped"]) == 1 and "step-9" in resumed["skipped"][0]


def test_when_no_live_replica_survives_the_job_restarts_from_its_checkpoint(
    tmp_path, reference_weights
):
    """Every rank killed in one step: live recovery is impossible, so the launcher stops every
    process and restarts the job from its newest checkpoint by itself (the drills that fired
    are not injected again); the final weights are still the failure-free run's."""
    kills = tuple(f"kill:rank={rank}:step={HELD_AT}" for rank in range(3))
    move_leash(tmp_path / "leash", HELD_AT)
    run_dir = tmp_path / "run"
    command_line = job_command(
        run_dir,
        steps=STEPS,
        chaos=kills,
        launcher_args=("--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "5"),
        script_args=("--leash", str(tmp_path / "leash")),
    )
    proc = subprocess.Popen(
        command_line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        await_ledger(run_dir, proc, lambda e: e["event"] == "checkpoint" and e["step"] == 9)
        await_ledger(run_dir, proc, lambda e: e["event"] == "progress" and e["step"] == HELD_AT - 1)
        move_leash(tmp_path / "leash", STEPS)  # the kills fire in step HELD_AT
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    assert "restarting every worker from checkpoint step 9" in output
    weights = __import__("torch").load(run_dir / "final.pt", weights_only=True)
    assert_bitwise_equal(weights, reference_weights(STEPS))

    events = ledger_events(run_dir)
    (restart,) = [e for e in events if e["event"] == "fallback_restart"]
    assert restart["from_step"] == 9 and restart["attempt"] == 1
    assert restart["steps_lost"] == HELD_AT - 1 - 9 and "no live replica" in restart["reason"]
    assert sum(e["event"] == "chaos_fired" for e in events) == 3  # not again after the restart
    summary = json.loads(
        subprocess.run(
            [*command_line[:3], "report", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert summary["status"] == "succeeded" and summary["steps_committed"] == STEPS
    assert summary["fallback_restarts"][0]["steps_lost"] == HELD_AT - 1 - 9
    assert summary["zero_loss_recoveries"] == 0


def test_time_based_checkpoints_are_taken_at_one_step_on_every_rank(tmp_path):
    """--checkpoint-every 1s on a job of at least 3 s of steps: rank 0 announces the step,
    every rank writes its part at it, so complete checkpoints appear (and verify)."""
    ckpt = tmp_path / "ckpt"
    job = run_job(
        tmp_path / "run",
        steps=60,
        launcher_args=("--checkpoint-dir", str(ckpt), "--checkpoint-every", "1s"),
        script_args=("--compute-seconds", "0.05"),
    )
    assert job.returncode == 0, job.output
    saved = [e for e in job.ledger() if e["event"] == "checkpoint"]
    assert saved and layout.complete_steps(ckpt)
    key = (tmp_path / "run" / layout.KEY_FILE).read_text()
    for step in layout.complete_steps(ckpt):
        assert layout.verify(layout.step_dir(ckpt, step), key).world_size == 3
    assert not [e for e in job.ledger() if e["event"] == "warning"]
