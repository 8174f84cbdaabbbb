"""The launcher dies (SIGKILL, nothing of it runs any more): every process of its job must be
gone within a lease (+1 s) of its death, whatever it was doing -- training, in the middle of a
recovery, SIGSTOPped, an idle spare, a refill spare still starting up.

Each case drives a real 2-worker job with one spare into the state by chaos, paced by the
job's own events (controller status, ledger), SIGKILLs the launcher, and polls ``/proc`` for
any process that carries the job's run directory in its environment.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import pytest

from tests.jobs import await_status, cli, free_port_pair, job_command
from tests.lifecycle import await_event, await_gone, await_reaped, job_pids, launched
from torchrelay.ledger import read_ledger
from torchrelay.runtime.control_link import LEASE_FACTOR

pytestmark = pytest.mark.slow
STEPS = 100_000  # never reached: the job is always ended from outside
HANG_FLOOR = 30.0  # a stopped worker is not detected (and replaced) while the test acts
LEASE = LEASE_FACTOR * HANG_FLOOR  # how long a cut-off worker may go on, at most


def _training(run_dir: Path) -> None:
    await_status(run_dir, lambda s: s["steps_committed"] >= 3 and len(s["spares"]) == 1)


def _recovering(run_dir: Path) -> None:
    # rank 1 dies in step 5; rank 0, the source of its state, stops itself in that transfer:
    # spare0 waits for the state (no refill yet: it starts once the recovery is done).
    await_event(run_dir, lambda e: e["event"] == "recovery_planned")
    await_event(run_dir, lambda e: e["event"] == "chaos_fired" and e["action"] == "hang")


def _refilling(run_dir: Path) -> None:
    # rank 1 dies in step 5 and spare0 takes its slot; the refill spare the recovery's end
    # starts has joined (it may still be warming up).
    await_event(run_dir, lambda e: e["event"] == "recovery_done")
    await_event(run_dir, lambda e: e["event"] == "process_join" and e["process"] == "spare1")


def _stopped(run_dir: Path) -> None:
    await_event(run_dir, lambda e: e["event"] == "chaos_fired" and e["action"] == "hang")
    await_event(run_dir, lambda e: e["event"] == "spare_ready")


STATES = {
    "training": ((), _training),
    "recovering": (("kill:rank=1:step=5", "hang:rank=0:step=5:phase=transfer"), _recovering),
    "refilling": (("kill:rank=1:step=5",), _refilling),
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


def _to_launcher(launcher, run_dir: Path, signum: int) -> None:
    """As Kubernetes sends it: to the container's first process only."""
    launcher.send_signal(signum)


def _to_terminal_group(launcher, run_dir: Path, signum: int) -> None:
    """As a terminal sends Ctrl-C: to its foreground process group, the launcher's (the
    workers lead groups of their own)."""
    os.killpg(launcher.pid, signum)


def _to_every_process(launcher, run_dir: Path, signum: int) -> None:
    """As Slurm's scancel sends it: to every process of the job; in the worst order, to the
    launcher last, once its agent has reaped the workers and the spare (and is about to report
    them). The node's template ignores it, as it must: the workers forked from it would die
    with it, of SIGKILL; the launcher ends it (``await_gone`` below checks that it did)."""
    for pid in job_pids(run_dir):
        os.kill(pid, signum)
    events = read_ledger(run_dir / "ledger.jsonl")
    await_reaped({e["pid"] for e in events if e["event"] == "process_join"})
    launcher.send_signal(signum)


STOPPED_BY = [
    (signal.SIGTERM, "training", _to_launcher),
    (signal.SIGINT, "training", _to_terminal_group),
    (signal.SIGTERM, "training", _to_every_process),
    (signal.SIGTERM, "recovering", _to_launcher),
    (signal.SIGTERM, "stopped", _to_launcher),
]


@pytest.mark.parametrize(
    ("signum", "state", "send"),
    STOPPED_BY,
    ids=lambda v: getattr(v, "name", getattr(v, "__name__", v)),
)
def test_sigterm_and_sigint_end_the_job_as_terminated(tmp_path, signum, state, send):
    run_dir = tmp_path / "run"
    name = signal.Signals(signum).name
    with start_job(run_dir, state) as launcher:
        reach(run_dir, state)
        failures = _failures(run_dir)
        sent = time.monotonic()
        send(launcher, run_dir, signum)
        assert launcher.wait(timeout=120) == 128 + signum
        stopped = time.monotonic() - sent
        seconds = await_gone([run_dir], timeout=5.0)
    print(f"{name} while {state}: the launcher exited after {stopped:.2f} s, all gone then")
    assert seconds < 1.0  # its workers and spares were stopped before it exited
    events = read_ledger(run_dir / "ledger.jsonl")
    (end,) = [e for e in events if e["event"] == "job_end"]
    assert end["status"] == "terminated" and end["signal"] == name
    # The workers' exits were the stop itself: no failure, no recovery, nothing but exits.
    assert _failures(run_dir) == failures
    assert {e["event"] for e in events[events.index(end) + 1 :]} <= {"process_exit"}
    assert f"torchrelay: job terminated by {name}" in run_dir.with_suffix(".out").read_text()
    report = cli("report", str(run_dir))
    assert report.returncode == 0 and f"terminated by {name}" in report.stdout, report


def _failures(run_dir: Path) -> list[dict]:
    return [e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "failure"]


NODE_TIMEOUT = 10.0  # a remote agent that loses its controller stops within this lease


def start_node(node_rank: int, endpoint: str, run_dir: Path, token: str, spares: int):
    command = job_command(
        run_dir,
        nproc=2,
        spares=spares,
        steps=STEPS,
        launcher_args=(
            *("--nnodes", "2", "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint),
            *("--node-timeout", str(NODE_TIMEOUT), "--hang-floor", str(HANG_FLOOR)),
        ),
    )
    return launched(command, run_dir, env={**os.environ, "TORCHRELAY_JOB_TOKEN": token})


def _two_nodes(tmp_path: Path, spares: tuple[int, int]):
    endpoint, token = f"127.0.0.1:{free_port_pair()}", secrets.token_hex(16)
    runs = (tmp_path / "node0", tmp_path / "node1")
    return runs, [start_node(r, endpoint, runs[r], token, spares[r]) for r in (0, 1)]


def test_remote_node_stops_when_the_controllers_launcher_is_killed(tmp_path):
    (run0, run1), (first, second) = _two_nodes(tmp_path, spares=(1, 1))
    with first as node0, second as node1:
        await_status(run0, lambda s: s["steps_committed"] >= 3 and len(s["spares"]) == 2)
        node0.send_signal(signal.SIGKILL)
        node0.wait()
        seconds = await_gone([run0, run1], timeout=NODE_TIMEOUT + 1.0)
        assert node1.wait(timeout=30) == 1
    print(f"controller's launcher killed: both nodes gone {seconds:.2f} s later")
    assert "lost the controller" in run1.with_suffix(".out").read_text()


def test_sigterm_stops_a_remote_node_and_then_the_controllers_node(tmp_path):
    (run0, run1), (first, second) = _two_nodes(tmp_path, spares=(2, 0))
    with first as node0, second as node1:
        await_status(run0, lambda s: s["steps_committed"] >= 3 and len(s["spares"]) == 2)
        node1.send_signal(signal.SIGTERM)
        assert node1.wait(timeout=60) == 143
        assert not job_pids(run1)  # stopped before its launcher exited
        # node 0 sees node 1 leave and recovers its slots; meanwhile the job is terminated
        await_event(run0, lambda e: e["event"] == "node_lost")
        node0.send_signal(signal.SIGTERM)
        assert node0.wait(timeout=120) == 143
        await_gone([run0], timeout=5.0)
    assert "received SIGTERM" in run1.with_suffix(".out").read_text()
    (end,) = [e for e in read_ledger(run0 / "ledger.jsonl") if e["event"] == "job_end"]
    assert end["status"] == "terminated" and end["signal"] == "SIGTERM"
