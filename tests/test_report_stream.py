"""Reports on open streams (control/report_stream.py, the ``Reports`` RPC) over real gRPC:
answered as the unary call answers, refused as it refuses, bounded by the same deadline, one
stream per lane shared by the threads that send on it, and opened again after a stream ends."""

from __future__ import annotations

import concurrent.futures
import threading

import grpc
import pytest

from tests.test_control_plane import job  # noqa: F401  (the controller behind a real server)
from torchrelay.control.client import SERVICE, ControlClient, ControlError
from torchrelay.control.protocol import NodeHeartbeat, PhaseDone, Progress, Ready
from torchrelay.control.report_stream import Lane, ReportStream, StreamEnded
from torchrelay.control.service import ControlServer


def _beat(worker: ControlClient, progress: Progress) -> dict:
    return worker.send_on(Lane.HEARTBEATS, progress, timeout=5.0)


def _worker(client, name: str = "worker0", slot: int = 0) -> ControlClient:
    worker = client(name)
    worker.join("worker", 1, "node0", slot)
    worker.report("max_steps", max_steps=10)
    return worker


def test_a_heartbeat_on_the_stream_is_a_progress_report_and_gets_the_lease(job):  # noqa: F811
    controller, _, client, _, _ = job
    worker = _worker(client)
    for step in range(3):
        reply = _beat(worker, Progress(generation=0, step=step, step_age=0.1))
        assert reply == {"hang_timeout": controller.config.hang_floor}
    assert controller.members["worker0"].committed == 2
    # One stream carried them all: the connection keeps it open between heartbeats.
    stream = worker._conn.stream(Lane.HEARTBEATS)
    _beat(worker, Progress(generation=0, step=3))
    assert worker._conn.stream(Lane.HEARTBEATS) is stream and not stream.ended


def test_each_lane_is_a_stream_of_its_own_and_a_report_is_handled_as_a_call(job):  # noqa: F811
    controller, _, client, _, _ = job
    worker = _worker(client)
    _beat(worker, Progress(generation=0, step=1))
    assert worker.send(PhaseDone(generation=0, phase="comm_ready", t=1.0)) == {}
    assert worker._conn.stream(Lane.REPORTS) is not worker._conn.stream(Lane.HEARTBEATS)
    # A refusal on one lane ends that lane's stream only (a worker is never "ready").
    with pytest.raises(ControlError) as err:
        worker.send(Ready(generation=0))
    assert err.value.code == "INVALID_ARGUMENT" and "reported ready" in err.value.message
    assert not worker._conn.stream(Lane.HEARTBEATS).ended
    _beat(worker, Progress(generation=0, step=2))
    assert controller.members["worker0"].committed == 2


def test_threads_sending_on_one_lane_each_get_the_answer_to_their_own_report(job):  # noqa: F811
    """The reports lane is every thread's (the poster's, a halt, an error): one request at a
    time on its stream, so no thread reads the answer to another's."""
    controller, _, client, _, _ = job
    worker = _worker(client)
    lease = {"hang_timeout": controller.config.hang_floor}

    def sends(thread: int) -> list[bool]:
        right = []
        for i in range(25):
            if (thread + i) % 2:
                right.append(worker.send(Progress(generation=0, step=3)) == lease)
            else:
                phase = PhaseDone(generation=0, phase="comm_ready", t=float(i))
                right.append(worker.send(phase) == {})
        return right

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = [ok for right in pool.map(sends, range(6)) for ok in right]
    assert len(answers) == 150 and all(answers)
    assert controller.members["worker0"].committed == 3


def test_a_report_waits_for_its_lane_no_longer_than_its_timeout(job):  # noqa: F811
    _, _, client, _, _ = job
    worker = _worker(client)
    held, release = threading.Event(), threading.Event()

    def hold_the_lane() -> None:
        with worker._lanes[Lane.REPORTS]:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_lane)
    holder.start()
    try:
        held.wait(30)
        with pytest.raises(ControlError) as err:
            worker.send(PhaseDone(generation=0, phase="comm_ready", t=1.0), timeout=0.2)
        assert err.value.code == "DEADLINE_EXCEEDED" and "busy" in err.value.message
    finally:
        release.set()
        holder.join()
    assert worker.send(PhaseDone(generation=0, phase="comm_ready", t=1.0)) == {}


def test_a_node_agents_heartbeats_go_on_a_stream_of_their_own(job):  # noqa: F811
    controller, _, client, _, _ = job
    agent = client("agent@node1")
    agent.node_join("node1")
    seen = []
    for _ in range(3):
        agent.node_report("node1", NodeHeartbeat(), timeout=5.0)
        seen.append(controller.nodes["node1"].last_seen)
    assert seen == sorted(seen) and seen[0] < seen[-1]
    assert set(agent._conn._streams) == {Lane.NODE_HEARTBEATS}  # they went on it
    stream = agent._conn._streams[Lane.NODE_HEARTBEATS]
    assert not stream.ended
    # A lost node's heartbeat is refused on the stream as the call was.
    controller.config.node_timeout = 0.1
    controller.start_monitor(interval=0.05)
    assert controller.wait_until(lambda: not controller.nodes["node1"].alive, timeout=10)
    with pytest.raises(ControlError) as err:
        agent.node_report("node1", NodeHeartbeat(), timeout=5.0)
    assert err.value.code == "FAILED_PRECONDITION" and stream.ended


def test_a_fenced_process_is_refused_on_the_stream_as_on_a_call(job):  # noqa: F811
    controller, _, client, _, _ = job
    worker = _worker(client)
    _beat(worker, Progress(generation=0, step=1))
    controller.on_exit("worker0", -9)  # presumed dead: its heartbeats are refused from now
    with pytest.raises(ControlError) as err:
        _beat(worker, Progress(generation=0, step=2))
    assert err.value.code == "FAILED_PRECONDITION" and "fenced" in err.value.message


def test_a_forged_heartbeat_is_refused_unauthenticated_and_changes_nothing(job):  # noqa: F811
    controller, _, client, _, _ = job
    worker = _worker(client)
    forger = client("worker0", key="not the job's token")
    with pytest.raises(ControlError) as err:
        _beat(forger, Progress(generation=0, step=5))
    assert err.value.code == "UNAUTHENTICATED"
    assert controller.members["worker0"].committed == -1
    # The worker's own stream was never touched.
    assert _beat(worker, Progress(generation=0, step=1))
    assert controller.members["worker0"].committed == 1


def test_an_answer_that_does_not_come_in_time_is_a_deadline_and_ends_the_stream():
    """A controller that takes no heed (paused, overloaded) costs the heartbeat its timeout,
    never more, and the stream is not read again: a late answer cannot be taken for the next
    heartbeat's."""
    arrived = threading.Event()
    release = threading.Event()

    def hold(requests, context):
        for _ in requests:
            arrived.set()
            release.wait(30)
            yield b"late"

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"Reports": grpc.stream_stream_rpc_method_handler(hold)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        method = channel.stream_stream(f"/{SERVICE}/Reports")
        stream = ReportStream(lambda r: method(r, wait_for_ready=True), Lane.HEARTBEATS)
        with pytest.raises(StreamEnded) as err:
            stream.exchange(b"beat", timeout=0.2)
        assert arrived.is_set()  # it was sent, and not answered within the timeout
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and stream.ended
        release.set()
        with pytest.raises(StreamEnded):  # never read again
            stream.exchange(b"beat", timeout=5.0)
    finally:
        release.set()
        channel.close()
        server.stop(0)


def test_a_closed_client_ends_its_stream_and_its_threads(job):  # noqa: F811
    _, _, client, _, _ = job
    worker = _worker(client)
    _beat(worker, Progress(generation=0, step=1))
    stream = worker._conn.stream(Lane.HEARTBEATS)
    worker.close()
    assert stream.ended
    stream.reader.join(timeout=10)
    assert not stream.reader.is_alive()


def test_a_stream_cut_between_heartbeats_costs_no_heartbeat(job):  # noqa: F811
    """The connection was reset between two heartbeats (the server went and came back on the
    same address): the next heartbeat goes out on a new stream, as a unary call would have
    waited for the connection, instead of failing on the old stream's end."""
    controller, _, client, run_dir, _ = job
    _worker(client)
    token = (run_dir / "token").read_text()
    first = ControlServer(controller, token)
    first.start()
    worker = ControlClient(first.address, token, "worker0")
    try:
        _beat(worker, Progress(generation=0, step=1))
        stream = worker._conn.stream(Lane.HEARTBEATS)
        first.stop()
        stream.reader.join(timeout=10)  # the old stream has ended, between heartbeats
        second = ControlServer(controller, token, port=first.port)
        second.start()
        try:
            reply = _beat(worker, Progress(generation=0, step=2))
            again = worker._conn.stream(Lane.HEARTBEATS)
        finally:
            second.stop()
    finally:
        worker.close()
    assert reply == {"hang_timeout": controller.config.hang_floor}
    assert again is not stream and controller.members["worker0"].committed == 2
