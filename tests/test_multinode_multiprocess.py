"""Two nodes on this machine (two launchers, `--nnodes 2`): losing a whole node -- its agent
and every worker on it, killed at once -- is cured from spares on the surviving node, with the
final weights bitwise equal to a failure-free run of the same world size."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys

import pytest

from tests.jobs import SCRIPTS, JobResult, assert_bitwise_equal, await_status, run_job

pytestmark = pytest.mark.slow
STEPS = 200
TOKEN = secrets.token_hex(16)  # the job secret both nodes share


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


def _node(rank: int, port: int, run_dir, spares: int, extra: tuple[str, ...] = ()):
    env = {**os.environ, "TORCHRELAY_JOB_TOKEN": TOKEN}
    command = [
        sys.executable,
        "-m",
        "torchrelay.cli.main",
        "run",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--nproc-per-node",
        "2",
        "--spares",
        str(spares),
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--run-dir",
        str(run_dir),
        "--quiet",
        *extra,
        str(SCRIPTS / "mlp_train.py"),
        "--steps",
        str(STEPS),
        "--out",
        str(run_dir / "final.pt"),
    ]
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_lost_node_is_cured_from_spares_on_the_other_node(tmp_path):
    reference = run_job(tmp_path / "reference", nproc=4, spares=0, steps=STEPS)
    assert reference.returncode == 0, reference.output

    port = _free_port_pair()
    run0, run1 = tmp_path / "node0", tmp_path / "node1"
    # rank 0 computes 50 ms longer per step so the node can be killed mid-run
    node0 = _node(0, port, run0, spares=2, extra=("--chaos", "slow:rank=0:step=0:seconds=0.05"))
    node1 = _node(1, port, run1, spares=0)
    try:
        await_status(run0, lambda s: s["steps_committed"] >= 30 and len(s["spares"]) == 2)
        os.killpg(node1.pid, signal.SIGKILL)  # the agent and both of its workers at once
        node1.wait(timeout=30)
        output, _ = node0.communicate(timeout=300)
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert node0.returncode == 0, output
    job = JobResult(0, output, run0)
    summary = job.summary()
    assert sorted(f["rank"] for f in summary["failures"]) == [2, 3]
    assert all(
        f["cause"] == "node lost" and f["recovered"] and f["lost_steps"] == 0
        for f in summary["failures"]
    )
    lost = next(e for e in job.ledger() if e["event"] == "node_lost")
    assert lost["node"] == "node1" and sorted(lost["processes"]) == ["worker2", "worker3"]
    planned = next(e for e in job.ledger() if e["event"] == "recovery_planned")
    assert all(p.startswith("spare") for p in planned["replaced"].values())  # node 0's spares
    assert_bitwise_equal(job.weights(), reference.weights())
