"""The controller over real gRPC: authentication, bad input, fencing of stale generations."""

from __future__ import annotations

import grpc
import pytest

from torchrelay.config import JobConfig
from torchrelay.control.controller import Controller
from torchrelay.control.service import SERVICE, ControlClient, ControlError, ControlServer
from torchrelay.control.wire import new_token
from torchrelay.ledger import Ledger, read_ledger


class FakeAgent:
    def __init__(self) -> None:
        self.spares_started = 0
        self.fenced: list[str] = []

    def start_spare(self) -> None:
        self.spares_started += 1

    def fence(self, process: str) -> None:
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
        worker.report("progress", generation=0, step=4)

    controller.on_exit("worker1", -9)  # the agent saw SIGKILL
    w0.report("halted", generation=0, committed=4, in_flight=5)
    assert controller.wait_until(lambda: controller.generation == 1, timeout=10)

    plan = next(m for m in iter(spare.watch()) if m["type"] == "plan")
    assert plan["slot"] == 1 and plan["target_step"] == 4 and plan["sources"] == [0]
    assert agent.fenced == ["worker1"] and agent.spares_started == 1  # pool refilled

    with pytest.raises(ControlError) as err:  # the old worker 1 comes back
        w1.report("progress", generation=0, step=5)
    assert err.value.code == "FAILED_PRECONDITION" and "fenced" in err.value.message
    events = [e["event"] for e in read_ledger(run_dir / "ledger.jsonl")]
    assert "fenced_refused" in events and "recovery_planned" in events
    w0.report("progress", generation=1, step=5)  # the survivor is not fenced
