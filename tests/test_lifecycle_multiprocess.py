"""The launcher dies (SIGKILL, nothing of it runs any more): every process of its job must be
gone within a lease (+1 s) of its death, whatever it was doing -- training, in the middle of a
recovery, SIGSTOPped, an idle spare, a refill spare still starting up.

Each case drives a real 2-worker job with one spare into the state by chaos, paced by the
job's own events (controller status, ledger), SIGKILLs the launcher, and polls ``/proc`` for
any process that carries the job's run directory in its environment.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.jobs import await_status, job_command
from tests.lifecycle import await_event, await_gone, job_pids, launched
from torchrelay.ledger import read_ledger
from torchrelay.runtime.relay import LEASE_FACTOR

pytestmark = pytest.mark.slow
STEPS = 100_000  # never reached: the job is always ended from outside
HANG_FLOOR = 30.0  # a stopped worker is not detected (and replaced) while the test acts
LEASE = LEASE_FACTOR * HANG_FLOOR  # how long a cut-off worker may go on, at most


def _training(run_dir: Path) -> None:
    await_status(run_dir, lambda s: s["steps_committed"] >= 3 and len(s["spares"]) == 1)


def _recovering(run_dir: Path) -> None:
    # rank 1 dies in step 5; rank 0, the source of its state, stops itself in that transfer:
    # spare0 waits for the state, a refill spare (started by the recovery) comes up.
    await_event(run_dir, lambda e: e["event"] == "chaos_fired" and e["action"] == "hang")
    await_event(run_dir, lambda e: e["event"] == "process_join" and e["process"] == "spare1")


def _stopped(run_dir: Path) -> None:
    await_event(run_dir, lambda e: e["event"] == "chaos_fired" and e["action"] == "hang")
    await_event(run_dir, lambda e: e["event"] == "spare_ready")


STATES = {
    "training": ((), _training),
    "recovering": (("kill:rank=1:step=5", "hang:rank=0:step=5:phase=transfer"), _recovering),
    "stopped": (("hang:rank=1:step=5",), _stopped),
}


def start_job(run_dir: Path, state: str):
    chaos, _ = STATES[state]
    command = job_command(
        run_dir,
        nproc=2,
        spares=1,
        steps=STEPS,
        chaos=chaos,
        launcher_args=("--hang-floor", str(HANG_FLOOR)),
    )
    return launched(command, run_dir)


def reach(run_dir: Path, state: str) -> set[int]:
    """Wait until the job is in ``state``; its live processes then, as found in ``/proc``
    (checked against the pids the ledger has for them, so the search cannot miss them)."""
    STATES[state][1](run_dir)
    pids = job_pids(run_dir)
    events = read_ledger(run_dir / "ledger.jsonl")
    joined = {e["pid"] for e in events if e["event"] == "process_join"}
    assert {pid for pid in joined if os.path.exists(f"/proc/{pid}")} <= pids, (joined, pids)
    return pids


@pytest.mark.parametrize("state", list(STATES))
def test_sigkilled_launcher_leaves_no_process_behind(tmp_path, state):
    run_dir = tmp_path / "run"
    with start_job(run_dir, state) as launcher:
        pids = reach(run_dir, state)
        assert len(pids) >= 3  # two workers and a spare at least
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        seconds = await_gone([run_dir], timeout=LEASE + 1.0)
    print(f"{state}: {len(pids)} processes, all gone {seconds:.2f} s after the launcher's death")
