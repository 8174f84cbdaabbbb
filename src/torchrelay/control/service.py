"""The control RPC: a gRPC service carrying sealed JSON messages (see :mod:`wire`).

Workers use ``Join`` and ``Report`` (unary) and ``Watch`` (a server stream of abort / plan /
finish messages for one process); remote node agents use ``NodeJoin``, ``NodeReport``
(heartbeats, process exits) and ``NodeWatch`` (start_spare / fence / chaos / finish);
operators use ``Status`` and ``Chaos``. Requests and responses are both sealed with the job token;
a request that fails authentication is rejected with ``UNAUTHENTICATED`` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from torchrelay.control.controller import Controller, FencedError, ProtocolError
from torchrelay.control.wire import WireError, seal, unseal

SERVICE = "torchrelay.Control"


class ControlError(RuntimeError):
    """The controller refused a request; ``code`` is the gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ControlServer:
    """Serves a :class:`Controller` on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        controller: Controller,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_workers: int = 64,
    ) -> None:
        self.controller = controller
        self._token = token
        # Each Watch stream holds a thread for the life of its process, hence the pool size.
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        handlers = {
            "Join": grpc.unary_unary_rpc_method_handler(self._unary(self._join)),
            "Report": grpc.unary_unary_rpc_method_handler(self._unary(self._report)),
            "Status": grpc.unary_unary_rpc_method_handler(
                self._unary(lambda _body: self.controller.status())
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self._stream(lambda body, active: controller.watch(str(body["process"]), active))
            ),
            "NodeJoin": grpc.unary_unary_rpc_method_handler(
                self._unary(lambda body: self.controller.join_node(str(body["node"])))
            ),
            "NodeReport": grpc.unary_unary_rpc_method_handler(
                self._unary(
                    lambda body: controller.node_report(str(body["node"]), str(body["kind"]), body)
                )
            ),
            "Chaos": grpc.unary_unary_rpc_method_handler(
                self._unary(
                    lambda body: controller.inject(
                        str(body["fault"]), str(body["target"]), float(body.get("seconds", 0.0))
                    )
                )
            ),
            "NodeWatch": grpc.unary_stream_rpc_method_handler(
                self._stream(lambda body, active: controller.watch_node(str(body["node"]), active))
            ),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{self.port}"

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float = 0.5) -> None:
        self._server.stop(grace).wait()

    def _open(self, request: bytes, context: grpc.ServicerContext) -> dict[str, Any]:
        try:
            return unseal(request, self._token)
        except WireError as exc:
            self.controller.ledger.record("rejected_message", reason=str(exc), peer=context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise AssertionError("unreachable") from exc

    def _unary(
        self, handler: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            body = self._open(request, context)
            try:
                return seal(handler(body), self._token)
            except FencedError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"fenced: {exc}")
            except (ProtocolError, KeyError, TypeError, ValueError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc!r}")
            raise AssertionError("unreachable")

        return call

    def _join(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.controller.join(
            str(body["process"]),
            str(body["role"]),
            int(body["pid"]),
            str(body["node"]),
            None if body.get("slot") is None else int(body["slot"]),
        )

    def _report(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.controller.report(str(body["process"]), str(body["kind"]), body)

    def _stream(
        self, messages: Callable[[dict[str, Any], Callable[[], bool]], Iterator[dict[str, Any]]]
    ) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        """A server-stream handler sealing each message; the stream ends with the RPC."""

        def handler(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            body = self._open(request, context)
            try:
                for message in messages(body, context.is_active):
                    yield seal(message, self._token)
            except ProtocolError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")

        return handler


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
    ) -> dict[str, Any]:
        body = {"role": role, "pid": pid, "node": node, "slot": slot}
        return self._call(self._join, body, timeout)

    def report(self, kind: str, timeout: float = 30.0, **body: Any) -> dict[str, Any]:
        return self._call(self._report, {"kind": kind, **body}, timeout)

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """The controller's view of the job (see :meth:`Controller.status`)."""
        return self._call(self._status, {}, timeout)

    def watch(self) -> Iterator[dict[str, Any]]:
        """Messages addressed to this process; raises :class:`ControlError` if the stream breaks."""
        return self._stream(self._watch, {"process": self.process})

    def node_join(self, node: str, timeout: float = 60.0) -> dict[str, Any]:
        return self._call(self._node_join, {"node": node}, timeout)

    def node_report(self, node: str, kind: str, timeout: float = 30.0, **body: Any) -> None:
        """A node agent's heartbeat (``kind="heartbeat"``), process exit or chaos notice."""
        self._call(self._node_report, {"node": node, "kind": kind, **body}, timeout)

    def chaos(self, fault: str, target: str, seconds: float = 0.0) -> dict[str, Any]:
        """Have the agent of ``target`` (a process or a node) inject ``fault`` (operators)."""
        body = {"fault": fault, "target": target, "seconds": seconds}
        return self._call(self._chaos, body, 20.0)

    def node_watch(self, node: str) -> Iterator[dict[str, Any]]:
        """Commands for a node agent; raises :class:`ControlError` if the stream breaks."""
        return self._stream(self._node_watch, {"process": self.process, "node": node})

    def _stream(self, method: Any, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        stream = method(seal(body, self._token), wait_for_ready=True)
        try:
            for response in stream:
                yield unseal(response, self._token)
        except grpc.RpcError as exc:
            raise ControlError(exc.code().name, exc.details() or "") from None

    def close(self) -> None:
        self._channel.close()
