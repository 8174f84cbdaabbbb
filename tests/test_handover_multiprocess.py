"""Planned handovers on real jobs: a slot whose GPU reads hot (an injected health reading) moves
to the spare at a step boundary; an operator drains a rank, and a whole node. No step is
redone, nothing counts as a failure, and the final weights are bitwise equal to a run without
any of it.

Paced by events: the job waits on a leash at a step until the handover has started (its
boundary lies past the leash), then runs to its end.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_event,
    await_events,
    await_status,
    cli,
    free_port_pair,
    move_leash,
    run_job,
    start_job,
    start_node,
)

pytestmark = pytest.mark.slow
STEPS = 60
HOLD_STEP = 20
# Steps of 50 ms: the boundary, about 0.75 s of steps past the last report, falls well before
# the end (on steps of a few ms it would lie past it, and the handover would be abandoned).
PACE = ("--compute-seconds", "0.05")


@pytest.fixture(scope="module")
def reference3(tmp_path_factory) -> JobResult:
    where = tmp_path_factory.mktemp("reference3")
    run = run_job(where, nproc=3, spares=0, steps=STEPS, script_args=PACE)
    assert run.returncode == 0, run.output
    return run


def _held_job(
    tmp_path: Path,
    launcher_args: tuple[str, ...] = (),
    launcher: str | None = None,
    script_args: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[str], Path, Path]:
    """A 3-rank job with a spare, every rank held at HOLD_STEP (``launcher``: see
    :func:`tests.jobs.job_command`; ``script_args``: more of tests/scripts/mlp_train.py's)."""
    run_dir, leash = tmp_path / "run", tmp_path / "leash"
    move_leash(leash, HOLD_STEP)
    proc = start_job(
        run_dir,
        nproc=3,
        spares=1,
        steps=STEPS,
        launcher_args=launcher_args,
        script_args=("--leash", str(leash), *PACE, *script_args),
        launcher=launcher,
    )
    held = lambda s: s["steps_committed"] >= HOLD_STEP and len(s["spares"]) == 1  # noqa: E731
    await_status(run_dir, held)
    return proc, run_dir, leash


def _finish(proc: subprocess.Popen[str], run_dir: Path, leash: Path) -> JobResult:
    """Once the handover has started, let the job run to its end."""
    await_event(run_dir, "handover_start")
    move_leash(leash, STEPS)
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return JobResult(proc.returncode, output, run_dir)


def _check_handover(job: JobResult, reference: JobResult, slots: list[int]) -> dict:
    assert job.returncode == 0, job.output
    events = job.ledger()
    assert not [e for e in events if e["event"] in ("failure", "recovery_done")]
    (done,) = [e for e in events if e["event"] == "handover_done"]
    assert sorted(done["slots"]) == slots
    assert done["recomputed_steps"] == 0 and done["lost_steps"] == 0
    assert done["target_step"] >= HOLD_STEP
    exits = {e["process"]: e["returncode"] for e in events if e["event"] == "process_exit"}
    assert all(exits[p] == 0 for p in done["retired"])  # they left cleanly, as told
    assert_bitwise_equal(job.weights(), reference.weights(), job)
    (reported,) = job.summary()["handovers"]
    assert reported["recomputed_steps"] == 0 and reported["slots"] == slots
    return done


def test_a_hot_gpu_moves_its_worker_to_the_spare(tmp_path, reference3):
    proc, run_dir, leash = _held_job(tmp_path, ("--health-poll", "0.2"))
    hot = cli("chaos", "--run-dir", str(run_dir), "overheat", "--rank", "1", "--celsius", "97")
    assert hot.returncode == 0, hot.stderr
    job = _finish(proc, run_dir, leash)
    done = _check_handover(job, reference3, [1])
    assert done["retired"] == ["worker1"]
    assert done["trigger"]["temperature_c"] == 97.0
    assert done["lead_seconds"] > 0 and "temperature" in done["reason"]
    quarantined = json.loads((run_dir / "quarantine.json").read_text())
    assert [(q["node"], q["device"]) for q in quarantined] == [("node0", 1)]


def test_an_operator_drains_a_rank(tmp_path, reference3):
    proc, run_dir, leash = _held_job(tmp_path)
    drained = cli("drain", "--run-dir", str(run_dir), "--rank", "2")
    assert drained.returncode == 0, drained.stderr
    assert "rank(s) 2 move to spares" in drained.stdout
    job = _finish(proc, run_dir, leash)
    done = _check_handover(job, reference3, [2])
    assert done["retired"] == ["worker2"] and "drain" in done["reason"]


def test_ranks_told_their_boundary_too_late_say_so_and_halt_together_after_the_next_step(
    tmp_path, reference3
):
    """The boundary set at the last reported step (lagging_launcher.py) while every rank waits
    inside the next: each hears it after looking past it and says so; none is aborted, and all
    halt after that step, which nobody redoes."""
    proc, run_dir, leash = _held_job(tmp_path, launcher="lagging_launcher.py")
    drained = cli("drain", "--run-dir", str(run_dir), "--rank", "2")
    assert drained.returncode == 0, drained.stderr
    boundary = await_event(run_dir, "handover_start")["boundary"]
    assert boundary == HOLD_STEP - 1  # what the ranks reported: they are inside the next step
    late = await_events(run_dir, "handover_late", 3)  # every rank said so before going on
    assert sorted(e["slot"] for e in late) == [0, 1, 2] and {e["step"] for e in late} == {boundary}
    job = _finish(proc, run_dir, leash)
    done = _check_handover(job, reference3, [2])
    assert done["target_step"] == HOLD_STEP  # they halted after the step they were in
    assert not [e for e in job.ledger() if e["event"] == "hang_detected"]
    assert job.summary()["handovers"][0]["told_late"] == [0, 1, 2]
    report = cli("report", str(run_dir))
    assert "recomputed 0, lost 0 (told the boundary late: rank(s) 0, 1, 2)" in report.stdout


def test_a_rank_told_its_boundary_late_alone_is_aborted_at_once_and_its_step_redone(
    tmp_path, reference3
):
    """Rank 1 hears the boundary only after committing it (``--hears-late``, a message that
    reached it late), while ranks 0 and 2 halt there: it waits in the next step's collective,
    which they never join. It says so, and the controller aborts that step at once: the hang
    timeout here (an hour) would outlast the test. That one step is redone; nothing is lost."""
    proc, run_dir, leash = _held_job(
        tmp_path, ("--hang-floor", "3600"), script_args=("--hears-late", "1")
    )
    drained = cli("drain", "--run-dir", str(run_dir), "--rank", "2")
    assert drained.returncode == 0, drained.stderr
    boundary = await_event(run_dir, "handover_start")["boundary"]
    assert boundary >= HOLD_STEP  # ahead of every rank: only rank 1 is told late
    job = _finish(proc, run_dir, leash)
    assert job.returncode == 0, job.output
    events = job.ledger()
    late = [e for e in events if e["event"] == "handover_late"]
    assert [(e["slot"], e["step"]) for e in late] == [(1, boundary)]
    (done,) = [e for e in events if e["event"] == "handover_done"]
    assert done["target_step"] == boundary and done["retired"] == ["worker2"]
    assert done["recomputed_steps"] == 1 and done["lost_steps"] == 0
    assert not [e for e in events if e["event"] in ("failure", "recovery_done", "hang_detected")]
    assert_bitwise_equal(job.weights(), reference3.weights(), job)
    assert job.summary()["handovers"][0]["told_late"] == [1]


def test_draining_a_whole_node_moves_its_slots_to_the_other_node(tmp_path):
    reference = run_job(tmp_path / "reference", nproc=4, spares=0, steps=STEPS, script_args=PACE)
    assert reference.returncode == 0, reference.output
    endpoint, token = f"127.0.0.1:{free_port_pair()}", secrets.token_hex(16)
    run0, run1, leash = tmp_path / "node0", tmp_path / "node1", tmp_path / "leash"
    move_leash(leash, HOLD_STEP)
    common = {"token": token, "steps": STEPS, "script_args": ("--leash", str(leash), *PACE)}
    node0 = start_node(0, endpoint, run0, spares=2, **common)
    node1 = start_node(1, endpoint, run1, spares=0, **common)
    try:
        held = lambda s: s["steps_committed"] >= HOLD_STEP and len(s["spares"]) == 2  # noqa: E731
        await_status(run0, held)
        drained = cli("drain", "--run-dir", str(run0), "--node", "1")
        assert drained.returncode == 0, drained.stderr
        job = _finish(node0, run0, leash)
        node1_output, _ = node1.communicate(timeout=120)
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert node1.returncode == 0, node1_output
    done = _check_handover(job, reference, [2, 3])
    assert sorted(done["retired"]) == ["worker2", "worker3"]
    assert all(p.startswith("spare") for p in done["replaced"].values())  # node 0's spares
