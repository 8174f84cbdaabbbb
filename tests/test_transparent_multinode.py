"""``torchrelay run --transparent`` over two nodes (two launchers on loopback, one rank each):
the copies are made on the donor's node by that node's agent.

Rank 0, on the controller's node, is SIGKILLed mid-epoch: the only donor is rank 1 on node 1,
whose agent clones it into a spare of node 1 that takes slot 0; then rank 1 is drained, and
node 1's agent moves it into a copy of itself. The job equals torchrun's, bit for bit.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import SCRIPTS, JobResult, assert_bitwise_equal, await_event, free_port_pair
from tests.snapshots import require_criu
from tests.test_transparent_multiprocess import (  # noqa: F401 (torchrun: a fixture)
    EPOCHS,
    HELD,
    PER_EPOCH,
    PLAIN,
    drain_when_held,
    job_processes,
    torchrun,
)

pytestmark = pytest.mark.slow


def node_command(rank: int, endpoint: str, run_dir: Path, script: tuple[str, ...]) -> list[str]:
    """Node ``rank`` of a 2-node --transparent job of ``script``, one rank per node, in
    ``run_dir/node<rank>``; the controller's node (0) kills its rank 0 in the middle of the
    second epoch. Rank 0 writes the final weights to ``run_dir/node0``, wherever it runs."""
    command = [sys.executable, "-m", "torchrelay.cli.main", "run", "--transparent"]
    command += ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint]
    command += ["--nproc-per-node", "1", "--spares", "0", "--run-dir", str(run_dir / f"node{rank}")]
    if rank == 0:
        command.append(f"--chaos=kill:rank=0:step={PER_EPOCH + 5}")
    out = run_dir / "node0" / "final.pt"
    return [*command, str(SCRIPTS / script[0]), *script[1:], "--out", str(out)]


def test_a_rank_of_the_controllers_node_is_cloned_from_another_node_and_drained_there(
    tmp_path,
    torchrun,  # noqa: F811 (the fixture imported above)
) -> None:
    require_criu()
    script = (*PLAIN, "--epochs", str(EPOCHS))
    drained = tmp_path / "drained"  # the job holds at epoch HELD until the drain is told
    held = (*script, f"--hold={HELD}:{drained}")
    endpoint, token = f"127.0.0.1:{free_port_pair()}", secrets.token_hex(16)
    run0, run1 = tmp_path / "node0", tmp_path / "node1"
    nodes, outputs = [], []
    try:
        for rank in (0, 1):
            outputs.append((tmp_path / f"node{rank}.out").open("w+"))
            nodes.append(
                subprocess.Popen(
                    node_command(rank, endpoint, tmp_path, held),
                    env={**os.environ, "TORCHRELAY_JOB_TOKEN": token},
                    stdout=outputs[-1],
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        await_event(run0, "recovery_done", timeout=240)
        drain_when_held(run0, 1, drained)
        returncodes = [node.wait(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    output = ""
    for rank, written in enumerate(outputs):
        written.seek(0)
        output += f"--- node{rank}\n{written.read()}"
        written.close()
    result = JobResult(returncodes[0], output, run0)
    assert returncodes == [0, 0], output
    assert f"step {PER_EPOCH + 5} voided" in output

    ledger = result.ledger()
    [cloned] = [e for e in ledger if e["event"] == "replica_cloned"]
    assert (cloned["donor"], cloned["slot"]) == ("worker1", 0)
    [joined] = [
        e for e in ledger if e["event"] == "process_join" and e["process"] == cloned["process"]
    ]
    assert joined["node"] == "node1"  # the copy was made on the donor's node, as its spare
    assert cloned["ordered"] <= cloned["parked"] <= cloned["dumped"] <= cloned["restored"]
    assert cloned["bytes"] > 10**7  # a whole process image
    [recovered] = [e for e in ledger if e["event"] == "recovery_done"]
    assert (recovered["lost_steps"], recovered["recomputed_steps"]) == (0, 1)
    # The dead rank's RNG mirror stayed on its node: the clone says it keeps its donor's.
    assert [e for e in ledger if e.get("what") == "rng_not_mirrored"]
    [migrated] = [e for e in ledger if e["event"] == "worker_migrated"]
    assert (migrated["process"], migrated["slot"]) == ("worker1", 1)
    assert migrated["bytes"] > 10**7
    [handed] = [e for e in ledger if e["event"] == "handover_done"]
    assert (handed["lost_steps"], handed["recomputed_steps"], handed["retired"]) == (0, 0, [])
    assert result.summary()["steps_committed"] == EPOCHS * PER_EPOCH
    assert_bitwise_equal(result.weights(), torchrun(*script), result)
    assert job_processes(run0) == [] and job_processes(run1) == []  # no copy, no nsinit left
