"""The control RPC server: a gRPC service carrying sealed JSON messages (see :mod:`wire`).

Workers use ``Join`` (unary), ``Reports`` (their reports, each answered in turn on a
bidirectional stream: :mod:`torchrelay.control.report_stream`; tests and tools send ``Report``,
a unary call each) and ``Watch`` (a server stream of abort / plan / finish messages for one
process); remote node agents use ``NodeJoin``, ``NodeReports`` (their heartbeats, on a
stream), ``NodeReport`` (process exits, chaos notices: a call each) and ``NodeWatch``
(start_spare / fence / chaos / finish); operators use ``Status`` and ``Chaos``.
The client is :mod:`torchrelay.control.client`.

Every request is authenticated before it is parsed, and admitted only once and while fresh
(:mod:`torchrelay.control.replay`); a refused one gets ``UNAUTHENTICATED``, changes nothing, and
is counted (:mod:`torchrelay.control.rejections`). Responses are sealed with the job token too.

Scale: the server runs on ``grpc.aio`` with its event loop in one background thread, so an open
stream is a suspended coroutine awaiting its :class:`~torchrelay.control.outbox.Outbox`, not a
thread: thousands of processes can hold one each. The controller's methods are synchronous
and take its lock (``Chaos`` may wait 10 s for a node agent), so the loop itself never blocks
on the controller: reports (a worker's and a node agent's, unary or on a stream) are handed to
it in batches by one thread (:mod:`torchrelay.control.handoff`), other requests run in a small
thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from torchrelay.control.client import SERVICE
from torchrelay.control.controller import Controller
from torchrelay.control.errors import FencedError, ProtocolError
from torchrelay.control.handoff import Handoff
from torchrelay.control.outbox import Outbox
from torchrelay.control.protocol import (
    JoinRequest,
    NodeJoin,
    Wire,
    decode_node_report,
    decode_report,
)
from torchrelay.control.replay import FRESHNESS_WINDOW, ReplayGuard
from torchrelay.control.wire import MAX_MESSAGE_BYTES, WireError, open_sealed, seal

T = TypeVar("T")
Handler = Callable[[dict[str, Any]], dict[str, Any] | Wire | None]
# How a handler is run off the loop: in the thread pool, or handed off with the reports.
Run = Callable[[Handler, dict[str, Any]], Awaitable[dict[str, Any] | Wire | None]]
# How often the open streams are checked for a process or node that is gone (as before).
POLL_SECONDS = 0.5
MAX_PENDING_REQUESTS = 1 << 16


class ControlServer:
    """Serves a :class:`Controller` on ``host:port`` (port 0 picks a free one).

    The port is bound on construction (``address`` is known before :meth:`start`);
    :meth:`start` and :meth:`stop` are synchronous. ``max_workers`` bounds the threads that run
    unary requests (``Chaos`` has two of its own); streams need none.
    """

    def __init__(
        self,
        controller: Controller,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_workers: int = 4,
        replay_window: float = FRESHNESS_WINDOW,
    ) -> None:
        self.controller = controller
        self._token = token
        self._replay = ReplayGuard(replay_window)
        # Open streams, each with the test that says it should end (checked by _sweep).
        self._streams: dict[object, tuple[Outbox, Callable[[], bool]]] = {}
        # Held: the loop keeps only a weak reference to a task (stop() cancels it).
        self._sweeper: asyncio.Task[None] | None = None
        # Few threads: more only contend for the GIL with the loop (measured: 4 instead of 16
        # cut the server's CPU per heartbeat by a fifth under load).
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers, thread_name_prefix="torchrelay-control"
        )
        # Chaos waits up to 10 s for a node agent: its own threads, so it never delays others.
        self._drills = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="torchrelay-control-chaos"
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="torchrelay-control-loop", daemon=True
        )
        self._thread.start()
        # Reports, the bulk of the requests, go to the controller in batches, in one thread.
        self._reports = Handoff(self._loop, "torchrelay-control-reports")
        self._server: grpc.aio.Server = self._run(self._create(host, port))
        self.address = f"{host}:{self.port}"

    async def _create(self, host: str, port: int) -> grpc.aio.Server:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # gRPC cancels calls beyond 1,000 not yet picked up by the loop; thousands of
                # processes joining at once are a burst to queue, not load to shed.
                ("grpc.server.max_pending_requests", MAX_PENDING_REQUESTS),
                ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_REQUESTS),
            ]
        )
        c = self.controller

        # Requests are decoded here, at the edge: the controller sees only typed messages.
        def report(body: dict[str, Any]) -> dict[str, Any] | Wire | None:
            return c.report(_name(body), decode_report(body))

        def node_report(body: dict[str, Any]) -> None:
            c.node_report(_name(body, "node"), decode_node_report(body))

        handlers = {
            "Join": grpc.unary_unary_rpc_method_handler(
                self._unary(lambda body: c.join(_name(body), JoinRequest.from_wire(body)))
            ),
            "Report": grpc.unary_unary_rpc_method_handler(self._unary(report, self._reports.call)),
            "Reports": grpc.stream_stream_rpc_method_handler(self._answers(report)),
            "Status": grpc.unary_unary_rpc_method_handler(self._unary(lambda _: c.status())),
            "NodeJoin": grpc.unary_unary_rpc_method_handler(
                self._unary(lambda body: c.join_node(NodeJoin.from_wire(body).node))
            ),
            "NodeReport": grpc.unary_unary_rpc_method_handler(
                self._unary(node_report, self._reports.call)
            ),
            "NodeReports": grpc.stream_stream_rpc_method_handler(self._answers(node_report)),
            "Chaos": grpc.unary_unary_rpc_method_handler(
                self._unary(
                    lambda body: c.inject(
                        str(body["fault"]), str(body["target"]), float(body.get("seconds", 0.0))
                    ),
                    functools.partial(self._call, pool=self._drills),
                )
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self._stream(lambda body: c.watch(str(body["process"])), self._member_messages)
            ),
            "NodeWatch": grpc.unary_stream_rpc_method_handler(
                self._stream(lambda body: c.watch_node(str(body["node"])), self._node_commands)
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.port = server.add_insecure_port(f"{host}:{port}")
        return server

    def _run(self, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` on the server's loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()  # type: ignore[arg-type]

    def start(self) -> None:
        self._run(self._start())

    async def _start(self) -> None:
        await self._server.start()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Every :data:`POLL_SECONDS`, wake the streams whose process or node is gone: one
        timer for all streams instead of one per stream."""
        while True:
            await asyncio.sleep(POLL_SECONDS)
            for outbox, ended in list(self._streams.values()):
                if ended():
                    outbox.nudge()

    @property
    def open_streams(self) -> int:
        """How many Watch and NodeWatch streams are open now."""
        return len(self._streams)

    def stop(self, grace: float = 0.5) -> None:
        """Stop serving (open streams are cancelled after ``grace`` s) and end the loop thread."""
        if self._loop.is_closed():
            return
        self._run(self._stop(grace))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._reports.close()
        # A Chaos request may still wait for its node agent: let it end on its own.
        for pool in (self._pool, self._drills):
            pool.shutdown(wait=False, cancel_futures=True)

    async def _stop(self, grace: float) -> None:
        await self._server.stop(grace)
        # What the server leaves behind (the sweeper; a stream whose status could not be sent
        # to a client already gone) ends here: a task still pending when the loop closes is
        # reported on stderr at exit, with a traceback, though nothing failed.
        current = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not current]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    # ------------------------------------------------------------------ requests
    async def _open(self, request: bytes, context: grpc.aio.ServicerContext) -> dict[str, Any]:
        """The authenticated, fresh, first-seen body of ``request``; else abort the RPC."""
        try:
            message = open_sealed(request, self._token)
            self._replay.admit(str(message.body.get("process", "")), message)
        except WireError as exc:
            self.controller.rejections.record(exc.reason, str(exc), context.peer())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise AssertionError("unreachable") from exc
        return message.body

    async def _call(
        self,
        function: Callable[..., T],
        *args: Any,
        pool: concurrent.futures.Executor | None = None,
    ) -> T:
        """Run a (locking, possibly waiting) controller method off the event loop."""
        return await self._loop.run_in_executor(pool or self._pool, function, *args)

    async def _answer(
        self,
        handler: Handler,
        request: bytes,
        context: grpc.aio.ServicerContext,
        run: Run | None = None,
    ) -> bytes:
        """The sealed answer of ``handler`` to ``request``, run by ``run`` (by default in the
        thread pool); else abort the RPC."""
        body = await self._open(request, context)
        try:
            answer = await (run or self._call)(handler, body)
            return seal(_encode(answer), self._token)
        except FencedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"fenced: {exc}")
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc!r}")
        raise AssertionError("unreachable")

    def _unary(
        self, handler: Handler, run: Run | None = None
    ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self._answer(handler, request, context, run)

        return call

    def _answers(
        self, handler: Handler
    ) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        """A bidirectional stream of requests each answered in turn, as ``_unary`` answers
        one (see :mod:`torchrelay.control.report_stream`). A refused request ends
        the stream with the code a unary call would have got."""

        async def stream(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            async for request in requests:
                yield await self._answer(handler, request, context, self._reports.call)

        return stream

    # ------------------------------------------------------------------ streams
    def _stream(
        self,
        lookup: Callable[[dict[str, Any]], tuple[Outbox, Callable[[], bool]]],
        drain: Callable[
            [dict[str, Any], Outbox, Callable[[], bool]], AsyncIterator[dict[str, Any]]
        ],
    ) -> Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        """A server-stream handler: find the outbox, then seal each message ``drain`` yields.

        Initial metadata goes out once the stream is registered, so a client can tell that its
        stream is open before any message arrives.
        """

        async def handler(
            request: bytes, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            body = await self._open(request, context)
            try:
                outbox, ended = await self._call(lookup, body)
            except (ProtocolError, KeyError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")
            key = object()  # a process may hold two streams (a reconnect): one entry each
            self._streams[key] = (outbox, ended)
            try:
                await context.send_initial_metadata(())
                async for message in drain(body, outbox, ended):
                    yield seal(message, self._token)
            finally:
                del self._streams[key]

        return handler

    @staticmethod
    async def _member_messages(
        body: dict[str, Any], outbox: Outbox, gone: Callable[[], bool]
    ) -> AsyncIterator[dict[str, Any]]:
        """A process's messages (abort, plan, finish) in order, until it should stop.

        Ends after a ``finish`` message, or once the process is dead or fenced
        and nothing is left for it; the client closing the stream cancels it.
        """
        while True:
            message = await outbox.next()
            if message is None:
                if gone():
                    return
                continue
            yield message
            if message["type"] == "finish":
                return

    async def _node_commands(
        self, body: dict[str, Any], outbox: Outbox, lost: Callable[[], bool]
    ) -> AsyncIterator[dict[str, Any]]:
        """A node agent's commands (start_spare, signal, chaos, finish) while the node is alive.

        When the stream ends without a ``finish`` -- the agent's connection closed, or the
        server stopped -- the controller declares every process of the node lost.
        """
        finished = False
        try:
            while not lost():
                command = await outbox.next()
                if command is None:
                    continue
                yield command
                if command["type"] == "finish":
                    finished = True
                    return
        finally:
            if not finished:
                # Submitted, not awaited: this also runs while the stream is being cancelled
                # (after stop() nobody is left to act on it).
                with contextlib.suppress(RuntimeError):
                    self._pool.submit(self.controller.node_stream_closed, str(body["node"]))


def _name(body: dict[str, Any], key: str = "process") -> str:
    """The sender's ``process`` (added by the client) or ``node`` named in a request."""
    name = body.get(key)
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"the request names no {key}")
    return name


def _encode(answer: dict[str, Any] | Wire | None) -> dict[str, Any]:
    """A controller's answer as the JSON object to seal (an empty one for none)."""
    if answer is None:
        return {}
    return answer.to_wire() if isinstance(answer, Wire) else answer
