"""Whole-node faults on a two-node job (two launchers, `--nnodes 2`, 2 workers each), drilled
with `torchrelay chaos`:

- **kill-node**: node 1's agent SIGKILLs every process of its node, itself last.
- **partition**: node 1 runs in its own network namespace, joined to node 0 by a veth pair,
  and its agent drops every packet on that link (nftables) for a while -- silence, no resets,
  as a failed link gives. Needs root, iproute2 and nftables (scripts/setup.sh installs
  nftables where it can).

Either way node 1's slots must move to node 0's spares in one recovery, the job must finish
bitwise equal to a failure-free run of 4 ranks, and nothing of node 1 may take part again.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    await_status,
    cli,
    free_port_pair,
    move_leash,
    run_job,
    start_node,
)

pytestmark = pytest.mark.slow
STEPS = 60
DRILL_STEP = 30  # the job waits in this step (on a leash) until the drill has gone out


@dataclass
class Drilled:
    """How both nodes of a drilled job ended."""

    job: JobResult
    node1_returncode: int
    node1_output: str
    drill_output: str


def drill_node1(
    run_dir: Path,
    drill: tuple[str, ...],
    host: str = "127.0.0.1",
    launcher_args: tuple[str, ...] = (),
    node_env: tuple[dict[str, str], dict[str, str]] = ({}, {}),
    node1_wrapper: tuple[str, ...] = (),
) -> Drilled:
    """Start both nodes, run ``torchrelay chaos --run-dir NODE0 DRILL...`` mid-run, and wait
    for both nodes to end."""
    endpoint, token = f"{host}:{free_port_pair(host)}", secrets.token_hex(16)
    run0, run1, leash = run_dir / "node0", run_dir / "node1", run_dir / "leash"
    move_leash(leash, DRILL_STEP)
    common = {"token": token, "steps": STEPS, "script_args": ("--leash", str(leash))}
    node0 = start_node(
        0, endpoint, run0, spares=2, launcher_args=launcher_args, env=node_env[0], **common
    )
    node1 = start_node(
        1,
        endpoint,
        run1,
        spares=0,
        launcher_args=launcher_args,
        env=node_env[1],
        wrapper=node1_wrapper,
        **common,
    )
    try:
        held = lambda s: s["steps_committed"] >= DRILL_STEP - 1 and len(s["spares"]) == 2  # noqa: E731
        await_status(run0, held)
        done = cli("chaos", "--run-dir", str(run0), *drill)
        assert done.returncode == 0, done.stderr
        move_leash(leash, STEPS)
        node1_output, _ = node1.communicate(timeout=60)
        output, _ = node0.communicate(timeout=300)
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    # Whatever the drill, no process of node 1 may outlive it.
    with pytest.raises(ProcessLookupError):
        os.killpg(node1.pid, 0)
    job = JobResult(node0.returncode, output, run0)
    return Drilled(job, node1.returncode, node1_output, done.stdout)


def assert_node1_slots_moved_to_node0(job: JobResult, reference: JobResult) -> dict:
    assert job.returncode == 0, job.output
    events = job.ledger()
    (lost,) = [e for e in events if e["event"] == "node_lost"]
    assert lost["node"] == "node1" and sorted(lost["processes"]) == ["worker2", "worker3"]
    summary = job.summary()
    assert sorted(f["rank"] for f in summary["failures"]) == [2, 3]
    assert all(
        f["cause"] == "node lost" and f["recovered"] and f["lost_steps"] == 0
        for f in summary["failures"]
    )
    after = events[events.index(lost) :]
    assert not [e for e in after if e["event"] == "process_join" and e["node"] == "node1"]
    planned = next(e for e in after if e["event"] == "recovery_planned")
    assert all(p.startswith("spare") for p in planned["replaced"].values())  # node 0's spares
    assert_bitwise_equal(job.weights(), reference.weights())
    return lost


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> JobResult:
    run = run_job(tmp_path_factory.mktemp("reference"), nproc=4, spares=0, steps=STEPS)
    assert run.returncode == 0, run.output
    return run


def test_killed_node_is_cured_from_spares_on_the_other_node(tmp_path, reference):
    refused = cli("chaos", "--run-dir", str(tmp_path), "kill-node", "--node", "0")
    assert refused.returncode != 0 and "no running job" in refused.stderr
    drilled = drill_node1(tmp_path, ("kill-node", "--node", "1"))
    assert "node1 is killing every process of the node" in drilled.drill_output
    assert drilled.node1_returncode == -signal.SIGKILL  # the agent, last of its node
    lost = assert_node1_slots_moved_to_node0(drilled.job, reference)
    assert "connection closed" in lost["reason"]


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
    """A network namespace for node 1, joined to this host by a veth pair."""
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


def test_partitioned_node_fences_itself_and_its_slots_move(tmp_path, reference, link):
    drilled = drill_node1(
        tmp_path,
        ("partition", "--rank", "3", "--seconds", "10"),
        host=link.host_ip,
        # A node timeout well under the hang floor: the node's silence decides, not its
        # workers' (whose heartbeats stop too).
        launcher_args=("--node-timeout", "3", "--hang-floor", "30"),
        node_env=({"GLOO_SOCKET_IFNAME": link.host_side}, {"GLOO_SOCKET_IFNAME": link.node_side}),
        node1_wrapper=("ip", "netns", "exec", link.namespace),
    )
    assert "rank 3 runs on node1" in drilled.drill_output
    assert f"dropping all traffic on {link.node_side} for 10 s" in drilled.drill_output
    # The isolated side stopped itself and took its workers down with it.
    assert drilled.node1_returncode == 1, drilled.node1_output
    assert "cut off from the controller" in drilled.node1_output
    lost = assert_node1_slots_moved_to_node0(drilled.job, reference)
    assert "no heartbeat" in lost["reason"]
    (cut,) = [e for e in drilled.job.ledger() if e["event"] == "chaos_injected"]
    assert cut["ok"] and cut["interfaces"] == [link.node_side]
    # The stall covers the silence before the node was declared lost.
    failure = drilled.job.summary()["failures"][0]
    assert failure["stall_seconds"] >= 3.0
    assert failure["stall_seconds"] > failure["recovery_seconds"]  # timed from detection
