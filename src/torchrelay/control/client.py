"""A process's connection to its job's controller (workers, node agents, operators' tools).

It imports neither the controller nor torch, so an operator's command starts fast. Every
request is sealed with the job token and a fresh nonce (see :mod:`torchrelay.control.wire`);
a refusal by the controller raises :class:`ControlError` with the gRPC status code. Messages
are the typed ones of :mod:`torchrelay.control.protocol`, encoded and decoded here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from torchrelay.control.protocol import (
    Command,
    JoinAnswer,
    JoinRequest,
    Message,
    NodeJoin,
    NodeJoinAnswer,
    NodeReport,
    Report,
    decode_command,
    decode_message,
)
from torchrelay.control.wire import seal, unseal

SERVICE = "torchrelay.Control"


class ControlError(RuntimeError):
    """The controller refused a request; ``code`` is the gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ControlClient:
    """A process's connection to its job's controller."""

    def __init__(self, address: str, token: str, process: str) -> None:
        self.process = process
        self._token = token
        self._channel = grpc.insecure_channel(address)
        self._join = self._channel.unary_unary(f"/{SERVICE}/Join")
        self._report = self._channel.unary_unary(f"/{SERVICE}/Report")
        self._watch = self._channel.unary_stream(f"/{SERVICE}/Watch")
        self._status = self._channel.unary_unary(f"/{SERVICE}/Status")
        self._node_join = self._channel.unary_unary(f"/{SERVICE}/NodeJoin")
        self._node_report = self._channel.unary_unary(f"/{SERVICE}/NodeReport")
        self._chaos = self._channel.unary_unary(f"/{SERVICE}/Chaos")
        self._node_watch = self._channel.unary_stream(f"/{SERVICE}/NodeWatch")

    def _call(self, method: Any, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            response = method(
                seal({"process": self.process, **body}, self._token),
                timeout=timeout,
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            raise ControlError(exc.code().name, exc.details() or "") from None
        return unseal(response, self._token)

    def join(
        self, role: str, pid: int, node: str, slot: int | None, timeout: float = 60.0
    ) -> JoinAnswer:
        request = JoinRequest(role=role, pid=pid, node=node, slot=slot)
        return JoinAnswer.from_wire(self._call(self._join, request.to_wire(), timeout))

    def send(self, report: Report, timeout: float = 30.0) -> dict[str, Any]:
        """Send a typed report; the answer is a :class:`Lease` for ``progress``, else empty."""
        return self._call(self._report, report.to_wire(), timeout)

    def report(self, kind: str, timeout: float = 30.0, **body: Any) -> dict[str, Any]:
        """An untyped report, as a test or a tool writes it: the controller decodes it and
        refuses a malformed one (``INVALID_ARGUMENT``). Processes use :meth:`send`."""
        return self._call(self._report, {"kind": kind, **body}, timeout)

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """The controller's view of the job (see :meth:`Controller.status`)."""
        return self._call(self._status, {}, timeout)

    def watch(self) -> Iterator[Message]:
        """Messages addressed to this process; raises :class:`ControlError` if the stream breaks,
        :class:`ProtocolError` on a message this version cannot read."""
        for wire in self._stream(self._watch, {"process": self.process}):
            yield decode_message(wire)

    def node_join(self, node: str, timeout: float = 60.0) -> NodeJoinAnswer:
        answer = self._call(self._node_join, NodeJoin(node=node).to_wire(), timeout)
        return NodeJoinAnswer.from_wire(answer)

    def node_report(self, node: str, report: NodeReport, timeout: float = 30.0) -> None:
        """A node agent's heartbeat, process exit or chaos notice."""
        self._call(self._node_report, {"node": node, **report.to_wire()}, timeout)

    def chaos(self, fault: str, target: str, seconds: float = 0.0) -> dict[str, Any]:
        """Have the agent of ``target`` (a process or a node) inject ``fault`` (operators)."""
        body = {"fault": fault, "target": target, "seconds": seconds}
        return self._call(self._chaos, body, 20.0)

    def node_watch(self, node: str) -> Iterator[Command]:
        """Commands for a node agent; raises :class:`ControlError` if the stream breaks,
        :class:`ProtocolError` on a command this version cannot read."""
        for wire in self._stream(self._node_watch, {"process": self.process, "node": node}):
            yield decode_command(wire)

    def _stream(self, method: Any, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        stream = method(seal(body, self._token), wait_for_ready=True)
        try:
            for response in stream:
                yield unseal(response, self._token)
        except grpc.RpcError as exc:
            raise ControlError(exc.code().name, exc.details() or "") from None

    def close(self) -> None:
        self._channel.close()
