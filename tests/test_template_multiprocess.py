"""Spares forked from the node's template (agent/template.py) in real jobs: a refill spare
comes from it and takes a slot with the job staying bitwise equal, and a killed launcher
leaves none of them (nor the template) behind."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.jobs import assert_bitwise_equal, job_command, run_job
from tests.lifecycle import await_event, await_gone, job_pids, launched
from torchrelay.ledger import read_ledger
from torchrelay.runtime import exit_holder

pytestmark = pytest.mark.slow
STEPS = 10


def test_a_refill_spare_forked_by_the_template_takes_a_slot_bitwise_equal(
    tmp_path, reference_weights
):
    # The first kill uses spare0; the second needs the refill spare started by the recovery.
    job = run_job(tmp_path, chaos=("kill:rank=1:step=2", "kill:rank=0:step=6"))
    assert job.returncode == 0, job.output
    assert_bitwise_equal(job.weights(), reference_weights(STEPS), job)

    ledger = job.ledger()
    spares = {e["process"]: e["pid"] for e in ledger if e["event"] == "process_join"}
    spares = {name: pid for name, pid in spares.items() if name.startswith("spare")}
    ready = {e["process"]: e for e in ledger if e["event"] == "spare_ready"}
    assert {"spare0", "spare1"} <= set(ready)
    assert all(ready[name]["forked"] for name in ready), ready
    forked = {int(p) for p in re.findall(r"forked pid (\d+)", job_log(tmp_path, "template"))}
    assert set(spares.values()) <= forked  # the template is the parent of every spare
    planned = [e for e in ledger if e["event"] == "recovery_planned"]
    taken = {spare for e in planned for spare in e["replaced"].values()}
    assert "spare1" in taken, planned  # the refill spare, forked after the first recovery


def job_log(run_dir, process: str) -> str:
    return (run_dir / "logs" / f"{process}.log").read_text()


def test_a_killed_launcher_leaves_no_forked_spare_nor_template_behind(tmp_path):
    run_dir = tmp_path / "run"
    command = job_command(run_dir, nproc=2, spares=2, steps=100_000)
    with launched(command, run_dir) as launcher:
        for name in ("spare0", "spare1"):
            await_event(
                run_dir, lambda e, n=name: (e["event"], e.get("process")) == ("spare_ready", n)
            )
        joined = [e for e in job_ledger(run_dir) if e["event"] == "process_join"]
        spares = {e["pid"] for e in joined if e["role"] == "spare"}
        pids = job_pids(run_dir)
        holders = {pid for pid in pids if _comm(pid) == "torchrelay-hold"}
        assert spares <= pids and len(pids - holders) == 5  # 2 workers, 2 spares, the template
        # With TORCHRELAY_EXIT_HOLDER=1, an exit holder each for the workers and spares.
        assert len(holders) == (4 if os.environ.get(exit_holder.SWITCH) == "1" else 0)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        seconds = await_gone([run_dir], timeout=30)
    print(f"{len(pids)} processes, all gone {seconds:.2f} s after the launcher's death")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # it ended meanwhile
        return ""


def job_ledger(run_dir) -> list[dict]:
    return read_ledger(run_dir / "ledger.jsonl")
