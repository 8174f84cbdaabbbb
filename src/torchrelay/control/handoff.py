"""Reports handed from the control server's event loop to the controller in batches.

The controller's methods are synchronous and take its lock; the server's event loop must never
block on them. Handing each report to a thread pool (``loop.run_in_executor``) costs more of
the loop's time than the controller's transition itself: a ``concurrent.futures.Future`` with
its own condition variable, a wrapping asyncio future, and a write to the loop's self-pipe for
every answer. A controller serves every process's heartbeats (two a second each) and a
recovery's reports (four per rank), all under one lock and on one interpreter.

:class:`Handoff` is one thread that takes the reports in the order they arrived: the loop
appends a call and an asyncio future to a queue and wakes the thread if it sleeps; the thread
runs every queued call, then settles the batch's futures with one wake of the loop (a long
batch in parts of :data:`SETTLE_EVERY`). Under load a batch holds many reports, so the
hand-off's cost per report falls as the load grows.

Failure behaviour: an exception a call raises is the awaiting coroutine's, as if it had called
it directly; a future whose RPC was cancelled meanwhile is skipped. A call that blocks (the
controller's lock held elsewhere, a durable write) delays the reports queued behind it, as the
lock would have anyway. After :meth:`close` nothing more runs: a call queued then is never
answered (the server's loop is stopping, and cancels its calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]
# A long batch is answered in parts, so its first reports are not held for its last.
SETTLE_EVERY = 32


def _settle(outcomes: list[_Outcome]) -> None:
    """Runs on the loop: each future takes its call's result or exception."""
    for future, result, error in outcomes:
        if future.done():  # cancelled: its RPC ended meanwhile
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


class Handoff:
    """Runs ``function(argument)`` calls from an event loop in one thread, in arrival order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._queue: deque[tuple[Callable[[Any], Any], Any, asyncio.Future[Any]]] = deque()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def call(self, function: Callable[[Any], Any], argument: Any) -> Any:
        """``function(argument)`` run in the hand-off's thread (call on the loop)."""
        future = self._loop.create_future()
        self._queue.append((function, argument, future))
        self._wake.set()
        return await future

    def close(self) -> None:
        """Stop the thread once its batch is done (it does not wait for it)."""
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            # Cleared before the queue is drained: a call queued after the drain sets it again.
            self._wake.clear()
            if self._closed:
                return
            outcomes: list[_Outcome] = []
            while self._queue:
                function, argument, future = self._queue.popleft()
                try:
                    outcomes.append((future, function(argument), None))
                except Exception as exc:  # the awaiting RPC's to answer, not this thread's
                    outcomes.append((future, None, exc))
                if len(outcomes) == SETTLE_EVERY or not self._queue:
                    # RuntimeError: the loop has closed, nobody awaits these any more.
                    with contextlib.suppress(RuntimeError):
                        self._loop.call_soon_threadsafe(_settle, outcomes)
                    outcomes = []
