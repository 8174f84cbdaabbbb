"""Reports over an open stream (the ``Reports`` RPC), not a call each.

A worker heartbeats twice a second, and a recovery has each of its processes report four times
(its halt, ``comm_ready``, ``transfer_done``, its first step): as unary calls each costs the
controller's gRPC server a new HTTP/2 stream, its metadata and its own completion events; as
messages on an open stream, a read and a write (docs/benchmarks.md, "Reports on open streams":
the controller's CPU per heartbeat halves, and a failure at 1,024 ranks is planned in half the
time once the halts are messages too). A process has two :class:`Lane` s, a stream each, so a
heartbeat never waits behind a report, nor a recovery's report behind a heartbeat: its
heartbeats, and every other report -- the poster's, and those a thread waits for (a halt, an
error), which are sent after the posted ones anyway. A node agent's heartbeats (two a second
per node) have a lane of their own too.

Contract: :meth:`ReportStream.exchange` sends one sealed request and returns the controller's
sealed answer to it. Answers come in the order of the requests, one each, and one thread
sends at a time (the client holds its lane's lock), so the answer read is the one to this
request.

Failure behaviour: a stream that ends (the controller is gone, the connection was closed, the
controller refused a request: ``FAILED_PRECONDITION`` for a fenced process) raises
:class:`StreamEnded` with gRPC's status code, as the unary call would have; an answer not in
within ``timeout`` cancels the stream and raises :class:`StreamEnded` with
``DEADLINE_EXCEEDED``, as a unary call's deadline does. A stream that ended is never used
again: the caller opens a new one for its next request. One that ended between requests
(its connection was reset) says so (:attr:`StreamEnded.unsent`): the request was not sent,
and a new stream, which waits for the connection as a unary call does, may carry it.
"""

from __future__ import annotations

import enum
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc


class Lane(enum.Enum):
    """A process's streams of reports."""

    HEARTBEATS = "heartbeats"  # the heartbeat thread's progress reports
    # Every other report: the poster's (see torchrelay.runtime.posting), and those a thread
    # waits for the answer of (a halt, an error), from any thread.
    REPORTS = "reports"
    # A node agent's heartbeats (the NodeReports RPC); its other reports, rare, are calls.
    NODE_HEARTBEATS = "node-heartbeats"

    @property
    def method(self) -> str:
        """The RPC whose streams carry this lane."""
        return "NodeReports" if self is Lane.NODE_HEARTBEATS else "Reports"


class StreamEnded(Exception):
    """The stream is over; ``code`` is gRPC's status code for why."""

    def __init__(self, code: grpc.StatusCode, details: str, unsent: bool = False) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.unsent = unsent  # it had ended before the request: a new stream may carry it


# A request iterator ends at this: the client half-closes the stream.
_END = b""


class ReportStream:
    """One open ``Reports`` call: requests in, answers out (see the module doc).

    ``open_call(requests)`` starts the call on a channel with the iterator of requests; the
    answers are read by a thread of this stream, so that :meth:`exchange` can wait for one
    with a timeout (a gRPC stream's reads have none).
    """

    def __init__(self, open_call: Callable[[Iterator[bytes]], Any], lane: Lane) -> None:
        self._requests: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[bytes | StreamEnded] = queue.SimpleQueue()
        self._ended: StreamEnded | None = None
        self._read_all = threading.Event()  # the reader saw the stream end
        self._call = open_call(iter(self._requests.get, _END))
        self.reader = threading.Thread(
            target=self._read, name=f"torchrelay-{lane.value}", daemon=True
        )
        self.reader.start()

    @property
    def ended(self) -> bool:
        return self._ended is not None

    def _read(self) -> None:
        try:
            for answer in self._call:
                self._answers.put(answer)
            ended = StreamEnded(grpc.StatusCode.UNAVAILABLE, "the controller ended the stream")
        except grpc.RpcError as exc:
            ended = StreamEnded(exc.code(), exc.details() or "")
        self._read_all.set()
        self._answers.put(ended)

    def exchange(self, request: bytes, timeout: float) -> bytes:
        """Send ``request``; its answer within ``timeout`` seconds, else :class:`StreamEnded`."""
        if self._ended is not None:
            raise self._ended
        if self._read_all.is_set():  # it broke between heartbeats (a connection reset)
            self.close()
            raise StreamEnded(grpc.StatusCode.UNAVAILABLE, "the stream had ended", unsent=True)
        self._requests.put(request)
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            answer = StreamEnded(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer in time")
        if isinstance(answer, StreamEnded):
            self._ended = answer
            self.close()
            raise answer
        return answer

    def close(self) -> None:
        """End the stream (gRPC's thread that sends the requests ends with it)."""
        if self._ended is None:
            self._ended = StreamEnded(grpc.StatusCode.CANCELLED, "the stream was closed")
        self._requests.put(_END)
        self._call.cancel()
