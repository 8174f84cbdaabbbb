"""A real network partition: node 1 of a two-node job runs in its own network namespace,
joined to node 0 by a veth pair, and `torchrelay chaos partition` makes its agent drop every
packet on that link (nftables) for a while -- silence, no resets, as a failed link gives.

The job must notice the silence, hand node 1's slots to node 0's spares and finish bitwise
equal to a failure-free run; the isolated side must kill its own workers and never rejoin.
Needs root, iproute2 and nftables (scripts/setup.sh installs nftables where it can).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

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
STEPS = 300
PARTITION_SECONDS = 10.0
NODE_TIMEOUT = 3.0


@dataclass
class Link:
    namespace: str
    host_side: str
    node_side: str
    host_ip: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def link() -> Iterator[Link]:
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        why = f"needs root and {missing or 'CAP_NET_ADMIN'} to build a network namespace"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must provide them (scripts/setup.sh installs nftables)")
        pytest.skip(why)
    tag = os.getpid() % 200 + 20
    link = Link(f"trpart{tag}", f"trh{tag}", f"trn{tag}", f"10.231.{tag}.1")
    subprocess.run(["ip", "netns", "del", link.namespace], capture_output=True, timeout=30)
    _ip("netns", "add", link.namespace)
    try:
        _ip("link", "add", link.host_side, "type", "veth", "peer", "name", link.node_side)
        _ip("link", "set", link.node_side, "netns", link.namespace)
        _ip("addr", "add", f"{link.host_ip}/24", "dev", link.host_side)
        _ip("link", "set", link.host_side, "up")
        inside = ("-n", link.namespace)
        _ip(*inside, "addr", "add", f"10.231.{tag}.2/24", "dev", link.node_side)
        _ip(*inside, "link", "set", link.node_side, "up")
        _ip(*inside, "link", "set", "lo", "up")
        yield link
    finally:
        subprocess.run(["ip", "netns", "del", link.namespace], capture_output=True, timeout=30)


def test_partitioned_node_is_fenced_and_its_slots_move_to_the_other_node(tmp_path, link):
    reference = run_job(tmp_path / "reference", nproc=4, spares=0, steps=STEPS)
    assert reference.returncode == 0, reference.output

    endpoint = f"{link.host_ip}:{free_port_pair(link.host_ip)}"
    token = secrets.token_hex(16)
    run0, run1 = tmp_path / "node0", tmp_path / "node1"
    # Node timeout well under the hang floor: the node's silence, not its workers', decides.
    timeouts = ("--node-timeout", str(NODE_TIMEOUT), "--hang-floor", "30")
    pace = ("--chaos", "slow:rank=0:step=0:seconds=0.05")
    node0 = start_node(
        0,
        endpoint,
        run0,
        token=token,
        steps=STEPS,
        spares=2,
        launcher_args=timeouts + pace,
        env={"GLOO_SOCKET_IFNAME": link.host_side},
    )
    node1 = start_node(
        1,
        endpoint,
        run1,
        token=token,
        steps=STEPS,
        spares=0,
        launcher_args=timeouts,
        env={"GLOO_SOCKET_IFNAME": link.node_side},
        wrapper=("ip", "netns", "exec", link.namespace),
    )
    try:
        await_status(run0, lambda s: s["steps_committed"] >= 30 and len(s["spares"]) == 2)
        drill = cli(
            "chaos",
            "--run-dir",
            str(run0),
            "partition",
            "--rank",
            "3",
            "--seconds",
            str(PARTITION_SECONDS),
        )
        assert drill.returncode == 0, drill.stderr
        assert "rank 3 runs on node1" in drill.stdout
        isolated, _ = node1.communicate(timeout=60)
        output, _ = node0.communicate(timeout=300)
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    # The isolated side stopped itself, and took its workers down with it.
    assert node1.returncode == 1, isolated
    assert "cut off from the controller" in isolated
    with pytest.raises(ProcessLookupError):
        os.killpg(node1.pid, 0)

    assert node0.returncode == 0, output
    job = JobResult(0, output, run0)
    events = job.ledger()
    (cut,) = [e for e in events if e["event"] == "chaos_injected"]
    assert cut["ok"] and cut["interfaces"] == [link.node_side]
    (lost,) = [e for e in events if e["event"] == "node_lost"]
    assert lost["node"] == "node1" and "no heartbeat" in lost["reason"]
    summary = job.summary()
    assert sorted(f["rank"] for f in summary["failures"]) == [2, 3]
    assert all(f["recovered"] and f["lost_steps"] == 0 for f in summary["failures"])
    # Nothing of node 1 took part after it was declared lost.
    after = events[events.index(lost) :]
    assert not [e for e in after if e["event"] == "process_join" and e["node"] == "node1"]
    planned = next(e for e in after if e["event"] == "recovery_planned")
    assert all(p.startswith("spare") for p in planned["replaced"].values())
    assert_bitwise_equal(job.weights(), reference.weights())
