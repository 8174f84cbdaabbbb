"""The controller over real gRPC: authentication, bad input, fencing of stale generations."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import grpc
import pytest

from torchrelay.agent.remote import RemoteNode
from torchrelay.chaos import parse_schedule
from torchrelay.config import JobConfig
from torchrelay.control.client import SERVICE, ControlClient, ControlError
from torchrelay.control.controller import Controller
from torchrelay.control.protocol import (
    ChaosNotice,
    CopyOutcome,
    CopyProcess,
    NodeExit,
    NodeHeartbeat,
    Plan,
    StartSpare,
)
from torchrelay.control.service import ControlServer
from torchrelay.control.state import MemberState
from torchrelay.control.wire import new_token, seal
from torchrelay.events_criu import CopyFailed
from torchrelay.ledger import Ledger, read_ledger
from torchrelay.report.summary import summarize


class FakeAgent:
    def __init__(self) -> None:
        self.spares_started = 0
        self.fenced: list[str] = []

    def start_spare(self) -> None:
        self.spares_started += 1

    def kill(self, process: str, signum: int = 9, stacks: bool = False) -> None:
        self.fenced.append(process)


@pytest.fixture
def job(tmp_path):
    config = JobConfig(
        script="train.py",
        script_args=[],
        nproc_per_node=2,
        run_dir=tmp_path,
        spares=1,
        spare_timeout=10,
        halt_timeout=10,
    )
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = FakeAgent()
    controller = Controller(config, ledger, agent)
    token = new_token()
    (tmp_path / "token").write_text(token)
    server = ControlServer(controller, token)
    server.start()
    clients: list[ControlClient] = []

    def client(process: str, key: str = token) -> ControlClient:
        clients.append(ControlClient(server.address, key, process))
        return clients[-1]

    yield controller, agent, client, tmp_path, server.address
    for c in clients:
        c.close()
    server.stop()
    controller.stop("test over")  # a recovery in progress ends before the ledger closes
    ledger.close()


def test_wrong_job_token_is_rejected_and_changes_nothing(job):
    controller, _, client, run_dir, _ = job
    intruder = client("worker0", key=new_token())
    with pytest.raises(ControlError) as err:
        intruder.join("worker", 1, "node0", 0)
    assert err.value.code == "UNAUTHENTICATED" and "wrong job token" in err.value.message
    assert controller.members == {}
    assert any(e["event"] == "rejected_message" for e in read_ledger(run_dir / "ledger.jsonl"))


def test_malformed_bytes_are_rejected(job):
    address = job[4]
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{SERVICE}/Join")
        with pytest.raises(grpc.RpcError) as err:
            call(b"\x80\x04\x95pickle-bytes", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "malformed" in err.value.details()


def test_bad_requests_get_clear_errors(job):
    _, _, client, _, _ = job
    worker = client("worker0")
    with pytest.raises(ControlError, match="outside world size"):
        worker.join("worker", 1, "node0", 7)
    worker.join("worker", 1, "node0", 0)
    with pytest.raises(ControlError, match="unknown report kind"):
        worker.report("explode")
    with pytest.raises(ControlError, match="never joined"):
        client("ghost").report("progress", generation=0, step=1)


def test_stale_generation_is_fenced_after_recovery(job):
    controller, agent, client, run_dir, _ = job
    w0, w1, spare = client("worker0"), client("worker1"), client("spare0")
    w0.join("worker", 1, "node0", 0)
    w1.join("worker", 2, "node0", 1)
    spare.join("spare", 3, "node0", None)
    spare.report("ready")
    for worker in (w0, w1):
        worker.report("max_steps", max_steps=10)
        worker.report("progress", generation=0, step=4)

    controller.on_exit("worker1", -9)  # the agent saw SIGKILL
    w0.report("halted", generation=0, committed=4, in_flight=5)
    assert controller.wait_until(lambda: controller.generation == 1, timeout=10)

    plan = next(m for m in iter(spare.watch()) if isinstance(m, Plan))
    assert plan.slot == 1 and plan.target_step == 4 and plan.sources == ((0, 0),)
    assert agent.fenced == ["worker1"] and agent.spares_started == 0  # not while it recovers

    with pytest.raises(ControlError) as err:  # the old worker 1 comes back
        w1.report("progress", generation=0, step=5)
    assert err.value.code == "FAILED_PRECONDITION" and "fenced" in err.value.message
    events = [e["event"] for e in read_ledger(run_dir / "ledger.jsonl")]
    assert "fenced_refused" in events and "recovery_planned" in events
    w0.report("progress", generation=1, step=5)  # the survivor is not fenced

    for member in (w0, spare):  # the recovery's first step: the spares are topped up now
        member.report("progress", generation=1, step=5, first_after_recovery=True, t=time.time())
    assert controller.wait_until(lambda: agent.spares_started == 1, timeout=10)


def test_heartbeat_reply_grants_the_worker_its_lease(job):
    controller, _, client, _, _ = job
    worker = client("worker0")
    worker.join("worker", 1, "node0", 0)
    worker.report("max_steps", max_steps=10)
    reply = worker.report("progress", generation=0, step=0, step_age=0.1, waiting=None)
    assert reply == {"hang_timeout": controller.config.hang_floor}


def test_silent_node_is_declared_lost_and_then_fenced_out(job):
    controller, _, client, run_dir, _ = job
    controller.config.node_timeout = 1.5
    agent1 = client("agent@node1")
    assert agent1.node_join("node1").node_timeout == 1.5
    w1 = client("worker1")
    w1.join("worker", 7, "node1", 1)
    agent1.node_report("node1", NodeHeartbeat())
    controller.start_monitor(interval=0.1)
    # No more heartbeats from node1: it is declared lost after the node timeout.
    assert controller.wait_until(lambda: not controller.nodes["node1"].alive, timeout=10)
    lost = next(e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "node_lost")
    assert lost["processes"] == ["worker1"] and "no heartbeat" in lost["reason"]
    assert controller.members["worker1"].state is MemberState.FENCED
    # The isolated side comes back: its agent and its worker are refused.
    for call in (
        lambda: agent1.node_report("node1", NodeHeartbeat()),
        lambda: agent1.node_report("node1", NodeExit(exited="worker1", returncode=0)),
        lambda: w1.report("progress", generation=0, step=9),
    ):
        with pytest.raises(ControlError) as err:
            call()
        assert err.value.code == "FAILED_PRECONDITION"
    controller.stop("test over")


def test_a_remote_agents_copy_outcome_reaches_the_ledger_for_its_own_processes_only(job):
    """Transparent mode's copy made by node1's agent: its outcome comes back over the sealed
    RPC; one that names another node's process, or a forged one, changes nothing."""
    controller, _, client, run_dir, address = job
    client("worker0").join("worker", 1, "node0", 0)
    agent1 = client("agent@node1")
    agent1.node_join("node1")
    client("worker1").join("worker", 7, "node1", 1)
    failed = CopyFailed(process="worker1", kind="migrate", reason="criu dump failed: x")
    agent1.node_report("node1", CopyOutcome(event=failed.to_json()))
    ledger = read_ledger(run_dir / "ledger.jsonl")
    assert [e["reason"] for e in ledger if e["event"] == "copy_failed"] == [failed.reason]
    not_its_own = CopyFailed(process="worker0", kind="clone", reason="x")
    with pytest.raises(ControlError) as err:
        agent1.node_report("node1", CopyOutcome(event=not_its_own.to_json()))
    assert err.value.code == "INVALID_ARGUMENT" and "no process of node 'node1'" in str(err.value)
    token = (run_dir / "token").read_text()
    ending = {"event": "job_end", "t": 1.0, "status": "succeeded"}  # not a copy's outcome
    body = {"process": "agent@node1", "node": "node1", "kind": "copied", "event": ending}
    refused = send_raw(address, "NodeReport", seal(body, token))
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not the outcome of a copy" in refused.details()
    ledger = read_ledger(run_dir / "ledger.jsonl")
    assert len([e for e in ledger if e["event"] == "copy_failed"]) == 1
    assert controller.outcome is None


def test_a_remote_agent_answers_a_copy_of_a_process_it_does_not_run_with_copy_failed(job):
    """node1's agent (a real RemoteNode, no process started) told to clone a process it never
    ran: a one-line copy_failed comes back over the RPC, nothing raises, nothing hangs."""
    controller, _, client, run_dir, address = job
    config = replace(controller.config, nnodes=2, node_rank=1, transparent=True, spares=0)
    node = RemoteNode(config, address, (run_dir / "token").read_text())
    try:
        node.client.node_join("node1")
        client("worker1").join("worker", 7, "node1", 1)
        node._copy(CopyProcess(kind="clone", process="worker1", slot=0, generation=0, ordered=1))
    finally:
        node.client.close()
    ledger = read_ledger(run_dir / "ledger.jsonl")
    [failed] = [e for e in ledger if e["event"] == "copy_failed"]
    assert failed["process"] == "worker1" and failed["kind"] == "clone"
    assert failed["reason"] == "worker1 is no process of node1's agent"


def test_operator_drills_are_routed_and_bad_ones_refused(job):
    controller, agent, client, _, _ = job
    client("worker0").join("worker", 1, "node0", 0)
    node_agent = client("agent@node1")
    node_agent.node_join("node1")
    operator = client("operator")
    assert operator.chaos("kill", "worker0")["pid"] == 1
    assert agent.fenced == ["worker0"]
    for fault, target, seconds, message in [
        ("partition", "node0", 5, "hosts the controller"),
        ("kill-node", "node0", 0, "hosts the controller"),
        ("partition", "node1", 0.1, "between 1 and 3600"),
        ("partition", "node9", 5, "never joined"),
        ("explode", "node1", 5, "unknown fault"),
        ("hang", "worker7", 0, "never joined"),
    ]:
        with pytest.raises(ControlError, match=message):
            operator.chaos(fault, target, seconds)
    commands: list[dict] = []

    def agent_answers() -> None:  # what RemoteNode does: say, then act
        commands.append(controller.node_outbox("node1").get(timeout=10))
        notice = ChaosNotice(fault="partition", ok=False, error="no nft")
        node_agent.node_report("node1", notice)

    answering = threading.Thread(target=agent_answers)
    answering.start()
    done = operator.chaos("partition", "node1", 5)
    answering.join()
    assert commands == [{"type": "chaos", "fault": "partition", "seconds": 5.0}]
    assert done["notice"] == {"fault": "partition", "ok": False, "error": "no nft"}


def test_scheduled_node_fault_goes_to_the_node_agent_at_its_step(job):
    controller, _, client, run_dir, _ = job
    controller.chaos_pending = {
        e.id: e for e in parse_schedule(["kill-node:node=1:step=5"], world_size=2, nnodes=2)
    }
    client("agent@node1").node_join("node1")
    worker = client("worker0")
    joined = worker.join("worker", 1, "node0", 0)
    assert joined.chaos == ()  # node faults are the controller's, never a worker's
    worker.report("max_steps", max_steps=10)
    worker.report("progress", generation=0, step=3)
    assert controller.node_outbox("node1").empty()
    worker.report("progress", generation=0, step=4)  # the job now runs step 5
    assert controller.node_outbox("node1").get_nowait()["fault"] == "kill-node"
    fired = [e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "chaos_fired"]
    assert [(e["action"], e["node"]) for e in fired] == [("kill-node", 1)]
    assert not controller.chaos_pending


def send_raw(address: str, method: str, data: bytes) -> grpc.RpcError | bytes:
    """Send ``data`` as a request as is: the response bytes, or the RPC error."""
    with grpc.insecure_channel(address) as channel:
        try:
            return channel.unary_unary(f"/{SERVICE}/{method}")(data, timeout=10)
        except grpc.RpcError as exc:
            return exc


def test_replayed_heartbeat_is_refused_and_changes_nothing(job):
    controller, _, client, run_dir, address = job
    worker = client("worker0")
    worker.join("worker", 1, "node0", 0)
    worker.report("max_steps", max_steps=10)
    token = (run_dir / "token").read_text()
    captured = seal(
        {"process": "worker0", "kind": "progress", "generation": 0, "step": 3, "step_age": 0.1},
        token,
    )
    assert isinstance(send_raw(address, "Report", captured), bytes)  # the original gets in
    member = controller.members["worker0"]
    seen, committed = member.last_seen, member.committed
    refused = send_raw(address, "Report", captured)  # a replay would vouch for a hung worker
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "replayed" in refused.details()
    assert (member.last_seen, member.committed) == (seen, committed)
    assert controller.status()["rejected_requests"] == {"replayed": 1}


def test_replayed_node_join_cannot_bring_a_lost_node_back(job):
    controller, _, _, run_dir, address = job
    token = (run_dir / "token").read_text()
    captured = seal({"process": "agent@node1", "node": "node1"}, token)
    assert isinstance(send_raw(address, "NodeJoin", captured), bytes)
    controller.node_stream_closed("node1")  # its agent died: the node is lost
    assert not controller.nodes["node1"].alive
    refused = send_raw(address, "NodeJoin", captured)
    assert isinstance(refused, grpc.RpcError) and "replayed" in refused.details()
    assert not controller.nodes["node1"].alive
    assert [e["event"] for e in read_ledger(run_dir / "ledger.jsonl")].count("node_join") == 1


def test_deeply_nested_request_is_refused_before_parsing(job):
    controller, _, client, _, address = job
    refused = send_raw(address, "Join", b"[" * 500_000)
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, refused.details()
    client("worker0").join("worker", 1, "node0", 0)  # the server is still serving
    assert "worker0" in controller.members


def test_garbage_flood_is_counted_and_the_ledger_stays_small(job):
    controller, _, _, run_dir, address = job
    ledger = run_dir / "ledger.jsonl"
    before = ledger.stat().st_size
    forged = seal({"process": "intruder", "node": "node9"}, new_token())
    codes = set()
    with grpc.insecure_channel(address) as channel:
        join = channel.unary_unary(f"/{SERVICE}/NodeJoin")
        for _ in range(8):  # 250 at a time: more in flight on one channel gets some CANCELLED
            calls = [join.future(data, timeout=60) for data in [b"garbage", forged] * 125]
            codes |= {call.exception().code() for call in calls}
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}
    counts = {"malformed": 1000, "unauthenticated": 1000}
    assert controller.status()["rejected_requests"] == counts
    assert controller.nodes == {}
    # 5 samples and 8 power-of-two summaries per reason, about 300 bytes each.
    assert ledger.stat().st_size - before < 2 * 13 * 400
    controller.stop("test over")
    end = read_ledger(ledger)[-1]
    assert end["event"] == "job_end" and end["rejected_requests"] == counts
    assert summarize(run_dir)["refused_messages"] == 2000


def test_the_client_imports_neither_the_controller_nor_the_server():
    # Operators' commands load only the client (torch comes in only through the package
    # __init__, which the CLI's lazy imports avoid).
    code = "import sys, torchrelay.control.client; print(' '.join(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert "torchrelay.control.controller" not in loaded
    assert "torchrelay.control.service" not in loaded


def test_watch_ends_when_its_process_dies_and_a_closed_node_stream_loses_the_node(job):
    controller, _, client, run_dir, _ = job
    worker = client("worker0")
    worker.join("worker", 1, "node0", 0)
    stream = worker.watch()
    ended: list[list[dict]] = []
    reader = threading.Thread(target=lambda: ended.append(list(stream)))
    reader.start()
    controller.on_exit("worker0", -9)
    reader.join(timeout=60)
    assert ended == [[]]  # ended without a message, as the process is dead

    agent = client("agent@node1")
    agent.node_join("node1")
    commands = agent.node_watch("node1")
    controller.node_outbox("node1").put({"type": "start_spare"})
    assert next(commands) == StartSpare()
    agent.close()  # the agent's connection closes without a finish
    assert controller.wait_until(lambda: not controller.nodes["node1"].alive, timeout=60)
    lost = [e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "node_lost"]
    assert [e["reason"] for e in lost] == ["its agent's connection closed"]


def test_wait_all_gone_keeps_one_deadline_for_the_members_and_the_node_streams(job, monkeypatch):
    """The members take the whole timeout (on a clock the test moves), so the node stream that
    never takes its message is waited for no longer: the call ends within its timeout."""
    import torchrelay.control.controller as controller_module

    controller, _, client, _, _ = job
    client("agent@node1").node_join("node1")
    controller.node_outbox("node1").put({"type": "start_spare"})  # never taken
    now = [1000.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], time=time.time)  # the rest keeps the real one
    monkeypatch.setattr(controller_module, "time", clock)

    def members_take_the_whole_timeout(predicate, timeout=None):
        now[0] += timeout
        return True

    monkeypatch.setattr(controller, "wait_until", members_take_the_whole_timeout)
    asked: list[float] = []
    outbox = controller.node_outbox("node1")
    monkeypatch.setattr(outbox, "wait_drained", lambda timeout: asked.append(timeout) or False)
    assert not controller.wait_all_gone(timeout=30.0)
    assert asked == [0.0]
