"""A process's connection to its job's controller (workers, node agents, operators' tools).

It imports neither the controller nor torch, so an operator's command starts fast. Every
request is sealed with the job token and a fresh nonce (see :mod:`torchrelay.control.wire`);
a refusal by the controller raises :class:`ControlError` with the gRPC status code. Messages
are the typed ones of :mod:`torchrelay.control.protocol`, encoded and decoded here.

With a :class:`~torchrelay.control.endpoint.Failover` (a job with a state store), a call that
cannot reach the controller looks for a newer leader's endpoint, within the call's own timeout;
once one is published the client moves there -- every thread's calls and streams, the ones
blocked on the old connection included -- and the call is made again. A broken stream waits up
to :data:`TAKEOVER_WAIT` for a new leader. A heartbeat's timeout is short, so its lease (see
:mod:`torchrelay.control.lease`) still decides when a process gives up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from torchrelay.control.endpoint import POLL_INTERVAL, Endpoint, Failover
from torchrelay.control.protocol import (
    Command,
    JoinAnswer,
    JoinRequest,
    Message,
    NodeHeartbeat,
    NodeJoin,
    NodeJoinAnswer,
    NodeReport,
    Report,
    decode_command,
    decode_message,
)
from torchrelay.control.report_stream import Lane, ReportStream, StreamEnded
from torchrelay.control.wire import seal, unseal

SERVICE = "torchrelay.Control"
# How a lost controller shows: refused or reset connections (UNAVAILABLE; UNKNOWN "Stream
# removed" when a stream's connection is reset), calls cut off by a client's move (CANCELLED)
# or waiting on a dead one (DEADLINE_EXCEEDED). The controller itself refuses with other codes.
UNREACHABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
TAKEOVER_WAIT = 20.0
"""Seconds a broken stream waits for a standby to publish its endpoint: a lost leader's lease
(5 s) runs out, a standby wins and starts serving well within it."""


class ControlError(RuntimeError):
    """The controller refused a request; ``code`` is the gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class _Connection:
    """One channel to one controller address, with its method stubs."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        unary = ("Join", "Report", "Status", "NodeJoin", "NodeReport", "Chaos")
        self.methods: dict[str, Any] = {
            name: self.channel.unary_unary(f"/{SERVICE}/{name}") for name in unary
        }
        for name in ("Watch", "NodeWatch"):
            self.methods[name] = self.channel.unary_stream(f"/{SERVICE}/{name}")
        for name in ("Reports", "NodeReports"):
            self.methods[name] = self.channel.stream_stream(f"/{SERVICE}/{name}")
        self._streams: dict[Lane, ReportStream] = {}

    def stream(self, lane: Lane) -> ReportStream:
        """This connection's stream of ``lane``, opened anew once the last one ended.

        Raises ``ValueError`` if the channel was closed (by another thread's move)."""
        stream = self._streams.get(lane)
        if stream is None or stream.ended:
            method = self.methods[lane.method]
            stream = self._streams[lane] = ReportStream(
                lambda requests: method(requests, wait_for_ready=True), lane
            )
        return stream

    def close(self) -> None:
        for stream in list(self._streams.values()):
            stream.close()
        self.channel.close()


class ControlClient:
    """A process's connection to its job's controller (see the module doc for failover).

    ``on_failover(endpoint)`` runs once per move to a new leader (a node agent points the
    processes it starts from then on at it).
    """

    def __init__(
        self,
        address: str,
        token: str,
        process: str,
        failover: Failover | None = None,
        on_failover: Callable[[Endpoint], None] | None = None,
    ) -> None:
        self.process = process
        self._token = token
        self._failover = failover
        self.on_failover = on_failover
        self._lock = threading.Lock()
        # One request at a time on a lane's stream. Reentrant: a move to a new leader tells
        # it again what this process waits with, from inside the send that found it.
        self._lanes = {lane: threading.RLock() for lane in Lane}
        self._closed = False
        self._conn = _Connection(address)

    @property
    def address(self) -> str:
        return self._conn.address

    @property
    def fails_over(self) -> bool:
        """Whether a lost controller may be followed by a new leader."""
        return self._failover is not None

    def _moved(self, failed: _Connection, wait: float = 0.0) -> bool:
        """Whether calls should be made again: this client has moved off ``failed`` -- by
        another thread, or now, to a newer leader published within ``wait`` seconds."""
        if self._failover is None:
            return False
        deadline = time.monotonic() + wait
        while self._conn is failed and not self._closed:
            found = self._failover.newer(failed.address)
            if found is not None:
                self._switch(failed, found)
            elif time.monotonic() >= deadline:
                return False
            else:
                time.sleep(POLL_INTERVAL)
        return self._conn is not failed and not self._closed

    def _switch(self, failed: _Connection, found: Endpoint) -> None:
        with self._lock:
            if self._conn is not failed:
                return
            self._conn = _Connection(found.control)
            # Calls blocked on the dead leader end now (CANCELLED) and are made again.
            failed.close()
        if self.on_failover is not None:
            self.on_failover(found)

    def _call(self, name: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        request = {"process": self.process, **body}

        def attempt(conn: _Connection, left: float) -> bytes:
            sealed = seal(request, self._token)
            return conn.methods[name](sealed, timeout=left, wait_for_ready=True)

        return self._following(attempt, timeout)

    def _following(
        self, attempt: Callable[[_Connection, float], bytes], timeout: float
    ) -> dict[str, Any]:
        """The unsealed answer of ``attempt(connection, seconds left)``, made again on a new
        leader's connection when the controller cannot be reached, within ``timeout``.

        Raises :class:`ControlError` with the status code of the attempt's failure (a
        ``grpc.RpcError``, or a stream's :class:`StreamEnded`)."""
        deadline = time.monotonic() + timeout
        while True:
            conn = self._conn
            try:
                return unseal(attempt(conn, max(0.0, deadline - time.monotonic())), self._token)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
            except StreamEnded as exc:
                code, details = exc.code, exc.details
            except ValueError:  # a call started on a channel another thread just closed
                if self._conn is not conn:
                    continue
                raise ControlError("CANCELLED", "the connection was closed") from None
            # A new leader may take a lease's length to come: wait for it within the call's
            # own timeout (a heartbeat's is short, so its lease still rules).
            left = deadline - time.monotonic()
            if code in UNREACHABLE and left > 0 and self._moved(conn, left):
                continue
            raise ControlError(code.name, details)

    def join(
        self,
        role: str,
        pid: int,
        node: str,
        slot: int | None,
        device: int | None = None,
        timeout: float = 60.0,
    ) -> JoinAnswer:
        request = JoinRequest(role=role, pid=pid, node=node, slot=slot, device=device)
        return JoinAnswer.from_wire(self._call("Join", request.to_wire(), timeout))

    def send(self, report: Report, timeout: float = 30.0) -> dict[str, Any]:
        """Send a typed report on the stream of :attr:`Lane.REPORTS`; the answer is a
        :class:`Lease` for ``progress``, else empty."""
        return self.send_on(Lane.REPORTS, report, timeout)

    def send_on(self, lane: Lane, report: Report, timeout: float = 30.0) -> dict[str, Any]:
        """Send ``report`` on the stream of ``lane`` (see
        :mod:`torchrelay.control.report_stream`) and return the controller's answer; from any
        thread, after the reports other threads are sending on the lane.

        Raises :class:`ControlError` with the controller's refusal, or when no answer came
        within ``timeout`` (``DEADLINE_EXCEEDED``; the wait for the lane counts); follows a new
        leader within it, as every call does."""
        return self._on_lane(lane, report.to_wire(), timeout)

    def _on_lane(self, lane: Lane, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        lock = self._lanes[lane]
        if not lock.acquire(timeout=timeout):
            raise ControlError(
                "DEADLINE_EXCEEDED", f"the {lane.value} stream stayed busy for {timeout:.1f} s"
            )
        try:
            return self._exchange(lane, body, max(0.0, deadline - time.monotonic()))
        finally:
            lock.release()

    def _exchange(self, lane: Lane, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        request = {"process": self.process, **body}

        def attempt(conn: _Connection, left: float) -> bytes:
            try:
                return conn.stream(lane).exchange(seal(request, self._token), left)
            except StreamEnded as exc:
                # A stream that ended between two requests is replaced once by a new one,
                # which waits for the connection; a new one that ended too is an error.
                if not exc.unsent:
                    raise
            return conn.stream(lane).exchange(seal(request, self._token), left)

        return self._following(attempt, timeout)

    def report(self, kind: str, timeout: float = 30.0, **body: Any) -> dict[str, Any]:
        """An untyped report, as a test or a tool writes it: the controller decodes it and
        refuses a malformed one (``INVALID_ARGUMENT``). Processes use :meth:`send`."""
        return self._call("Report", {"kind": kind, **body}, timeout)

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """The controller's view of the job (see :meth:`Controller.status`)."""
        return self._call("Status", {}, timeout)

    def watch(self) -> Iterator[Message]:
        """Messages addressed to this process; raises :class:`ControlError` if the stream breaks,
        :class:`ProtocolError` on a message this version cannot read."""
        for wire in self._stream("Watch", {"process": self.process}):
            yield decode_message(wire)

    def node_join(self, node: str, timeout: float = 60.0) -> NodeJoinAnswer:
        answer = self._call("NodeJoin", NodeJoin(node=node).to_wire(), timeout)
        return NodeJoinAnswer.from_wire(answer)

    def node_report(self, node: str, report: NodeReport, timeout: float = 30.0) -> None:
        """A node agent's heartbeat (on its open stream, :attr:`Lane.NODE_HEARTBEATS`), or
        its report of a process exit, a chaos notice, health readings, a copy's outcome (a
        call each: rare, and from several threads)."""
        body = {"node": node, **report.to_wire()}
        if isinstance(report, NodeHeartbeat):
            self._on_lane(Lane.NODE_HEARTBEATS, body, timeout)
        else:
            self._call("NodeReport", body, timeout)

    def chaos(self, fault: str, target: str, seconds: float = 0.0) -> dict[str, Any]:
        """Have the agent of ``target`` (a process or a node) inject ``fault`` (operators)."""
        body = {"fault": fault, "target": target, "seconds": seconds}
        return self._call("Chaos", body, 20.0)

    def node_watch(self, node: str) -> Iterator[Command]:
        """Commands for a node agent; raises :class:`ControlError` if the stream breaks,
        :class:`ProtocolError` on a command this version cannot read."""
        for wire in self._stream("NodeWatch", {"process": self.process, "node": node}):
            yield decode_command(wire)

    def _stream(self, name: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The stream's messages; re-opened on a new leader (the messages the old one queued
        are lost with it: the new leader re-decides from the durable state)."""
        while True:
            conn = self._conn
            try:
                for response in conn.methods[name](seal(body, self._token), wait_for_ready=True):
                    yield unseal(response, self._token)
                return
            except grpc.RpcError as exc:
                if exc.code() in UNREACHABLE and self._moved(conn, TAKEOVER_WAIT):
                    continue
                raise ControlError(exc.code().name, exc.details() or "") from None
            except ValueError:  # opened on a channel another thread just closed
                if self._conn is not conn:
                    continue
                raise ControlError("CANCELLED", "the connection was closed") from None

    def close(self) -> None:
        """Close the connection for good: calls and streams on it end, none moves on."""
        self._closed = True
        self._conn.close()
