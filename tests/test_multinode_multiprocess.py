"""Two nodes on this machine (two launchers, `--nnodes 2`): losing a whole node -- its agent
and every worker on it, killed at once by `torchrelay chaos kill-node` -- is cured from spares
on the surviving node, with the final weights bitwise equal to a failure-free run of the same
world size."""

from __future__ import annotations

import os
import secrets
import signal

import pytest

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_status,
    cli,
    free_port_pair,
    run_job,
    start_node,
)

pytestmark = pytest.mark.slow
STEPS = 200
# rank 0 computes 50 ms longer per step, so the drill lands mid-run
PACE = ("--chaos", "slow:rank=0:step=0:seconds=0.05")


def test_lost_node_is_cured_from_spares_on_the_other_node(tmp_path):
    reference = run_job(tmp_path / "reference", nproc=4, spares=0, steps=STEPS)
    assert reference.returncode == 0, reference.output

    endpoint, token = f"127.0.0.1:{free_port_pair()}", secrets.token_hex(16)
    run0, run1 = tmp_path / "node0", tmp_path / "node1"
    node0 = start_node(0, endpoint, run0, token=token, steps=STEPS, spares=2, launcher_args=PACE)
    node1 = start_node(1, endpoint, run1, token=token, steps=STEPS, spares=0)
    try:
        await_status(run0, lambda s: s["steps_committed"] >= 30 and len(s["spares"]) == 2)
        refused = cli("chaos", "--run-dir", str(run0), "kill-node", "--node", "0")
        assert refused.returncode != 0 and "hosts the controller" in refused.stderr
        drill = cli("chaos", "--run-dir", str(run0), "kill-node", "--node", "1")
        assert drill.returncode == 0, drill.stderr
        assert node1.wait(timeout=30) == -signal.SIGKILL  # the agent, last of its node
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
