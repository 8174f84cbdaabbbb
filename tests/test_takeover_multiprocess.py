"""The controller survives its host: a 3-node job (three launchers on this machine, one worker
each, a spare on nodes 1 and 2) with its state in a real etcd loses node 0 -- its launcher,
controller, agent and worker, by SIGKILL to the whole process group -- and a standby on node 1
or 2 takes over: it reloads the durable state, serves a new control endpoint and rendezvous
store, the surviving processes follow it, and the lost slots move to spares. Nothing committed
is lost and the final weights are bitwise equal to a failure-free run.

Paced by events: the job waits on a leash at a step until the test has struck, the standby's
takeover is read from its ledger, spares are held on a file until the test lets them report.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.etcd import EtcdServer
from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_event,
    await_status,
    cli,
    free_port_pair,
    ledger_events,
    move_leash,
    run_job,
    start_node,
)

pytestmark = pytest.mark.slow
STEPS = 40
STRIKE_STEP = 20
# Generous against a loaded machine: a takeover (a 5 s leader lease running out, then a
# standby taking over) must fit within them, and nothing here is expected to hang.
TIMEOUTS = ("--node-timeout", "20", "--hang-floor", "20")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> JobResult:
    run = run_job(tmp_path_factory.mktemp("reference"), nproc=3, spares=0, steps=STEPS)
    assert run.returncode == 0, run.output
    return run


Strike = Callable[[subprocess.Popen[str], list[Path], Path], None]


def _three_nodes(
    tmp_path: Path, etcd_url: str, strike: Strike
) -> tuple[dict[int, subprocess.Popen[str]], dict[int, str], list[Path]]:
    """Run the job, ``strike(node0, run_dirs, leash)`` once every rank waits at STRIKE_STEP,
    let the spares report, and wait for nodes 1 and 2 to end. Returns the nodes, the output of
    nodes 1 and 2, and the run directories."""
    endpoint, token = f"127.0.0.1:{free_port_pair()}", secrets.token_hex(16)
    runs = [tmp_path / f"node{n}" for n in range(3)]
    leash, spare_leash = tmp_path / "leash", tmp_path / "spares-go"
    move_leash(leash, STRIKE_STEP)
    nodes = {
        n: start_node(
            n,
            endpoint,
            runs[n],
            token=token,
            steps=STEPS,
            spares=0 if n == 0 else 1,
            nnodes=3,
            nproc=1,
            launcher_args=("--state", f"{etcd_url}/takeover", *TIMEOUTS),
            script_args=("--leash", str(leash), "--spare-leash", str(spare_leash)),
        )
        for n in range(3)
    }
    outputs: dict[int, str] = {}
    try:
        held = lambda s: s["steps_committed"] >= STRIKE_STEP and len(s["spares"]) == 2  # noqa: E731
        await_status(runs[0], held)
        strike(nodes[0], runs, leash)
        spare_leash.touch()
        for n in (1, 2):
            outputs[n], _ = nodes[n].communicate(timeout=300)
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for proc in nodes.values():  # nothing of any node outlives the job
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)
    return nodes, outputs, runs


def _check_takeover(
    nodes: dict[int, subprocess.Popen[str]],
    outputs: dict[int, str],
    runs: list[Path],
    reference: JobResult,
    lost_slots: list[int],
) -> dict:
    """The standby's ledger tells the takeover, one recovery of ``lost_slots`` losing no
    step, and success; the weights are the failure-free run's. Returns its recovery_done."""
    assert nodes[0].returncode == -signal.SIGKILL
    assert nodes[1].returncode == 0 and nodes[2].returncode == 0, outputs
    (leader,) = [r for r in runs[1:] if any(e["event"] == "job_end" for e in ledger_events(r))]
    events = ledger_events(leader)
    (took,) = [e for e in events if e["event"] == "controller_takeover"]
    assert took["previous"] == "node0" and took["leader"] == leader.name
    assert took["committed"] >= STRIKE_STEP - 1
    (lost,) = [e for e in events if e["event"] == "node_lost"]
    assert lost["node"] == "node0" and lost["processes"] == ["worker0"]
    (done,) = [e for e in events if e["event"] == "recovery_done"]
    assert sorted(done["slots"]) == lost_slots and done["lost_steps"] == 0
    (end,) = [e for e in events if e["event"] == "job_end"]
    assert end["status"] == "succeeded" and end["steps_committed"] == STEPS
    # Rank 0 (it saves the weights) now runs on the node whose spare took slot 0.
    (saved,) = [r for r in runs[1:] if (r / "final.pt").exists()]
    job = JobResult(0, outputs[1] + outputs[2], saved)
    assert_bitwise_equal(job.weights(), reference.weights(), job)
    return done


def test_standby_takes_over_when_node0_dies(tmp_path, etcd: EtcdServer, reference):
    def strike(node0: subprocess.Popen[str], runs: list[Path], leash: Path) -> None:
        os.killpg(node0.pid, signal.SIGKILL)
        move_leash(leash, STEPS)  # the survivors go on, find rank 0 gone, and halt

    nodes, outputs, runs = _three_nodes(tmp_path, etcd.url, strike)
    _check_takeover(nodes, outputs, runs, reference, lost_slots=[0])


def test_controller_killed_during_a_recovery(tmp_path, etcd: EtcdServer, reference):
    """Rank 1 is killed; while its recovery waits for a spare (held back), node 0 dies too:
    the standby carries the recovery on for both slots, in its own rendezvous store."""

    def strike(node0: subprocess.Popen[str], runs: list[Path], leash: Path) -> None:
        killed = cli("chaos", "--run-dir", str(runs[0]), "kill", "--rank", "1")
        assert killed.returncode == 0, killed.stderr
        await_event(runs[0], "recovery_start")
        os.killpg(node0.pid, signal.SIGKILL)
        move_leash(leash, STEPS)

    nodes, outputs, runs = _three_nodes(tmp_path, etcd.url, strike)
    done = _check_takeover(nodes, outputs, runs, reference, lost_slots=[0, 1])
    assert sorted(f["slot"] for f in done["failures"]) == [0, 1]
