"""A message queue between the controller's threads and the server's event loop.

The controller (synchronous, under its lock, in any thread) puts messages for one process or
node agent; the control server's stream for it awaits :meth:`Outbox.next` on the event loop,
so an open stream costs no thread. ``put`` wakes an awaiting stream with
``loop.call_soon_threadsafe``; ``nudge`` wakes it without a message, to re-check its end.
Synchronous callers (tests, tools) use :meth:`Outbox.get`, like :meth:`queue.Queue.get`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import deque
from typing import Any


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Outbox:
    """FIFO of messages; ``put`` from any thread, consume with ``next`` (async) or ``get``."""

    def __init__(self) -> None:
        self._items: deque[dict[str, Any]] = deque()
        self._ready = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def put(self, message: dict[str, Any]) -> None:
        """Append ``message`` and wake its consumer (never blocks for long)."""
        with self._ready:
            self._items.append(message)
            self._ready.notify()
        self.nudge()

    def nudge(self) -> None:
        """Wake an awaiting :meth:`next` even without a message (it returns None then), so the
        stream re-checks whether it should end."""
        with self._ready:
            waiters = list(self._waiters)
        for loop, waiter in waiters:
            # RuntimeError: the server's loop has closed, nobody is awaiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, waiter)

    def get(self, timeout: float | None = None) -> dict[str, Any]:
        """The oldest message, waiting up to ``timeout`` s; raises :class:`queue.Empty`."""
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._items), timeout):
                raise queue.Empty
            return self._take()

    def get_nowait(self) -> dict[str, Any]:
        return self.get(timeout=0)

    def pending(self) -> list[dict[str, Any]]:
        """A copy of the messages not consumed yet, oldest first (nothing is taken out)."""
        with self._ready:
            return list(self._items)

    def empty(self) -> bool:
        with self._ready:
            return not self._items

    def wait_drained(self, timeout: float) -> bool:
        """Wait until every message put so far has been taken; ``False`` after ``timeout``."""
        with self._ready:
            return self._ready.wait_for(lambda: not self._items, timeout)

    def _take(self) -> dict[str, Any]:
        """The oldest message (there is one); called with the lock held. Wakes
        :meth:`wait_drained`."""
        item = self._items.popleft()
        self._ready.notify_all()
        return item

    async def next(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The oldest message, awaited on the running loop; None after ``timeout`` s (None:
        no limit) or a :meth:`nudge`. Cancellation (the stream closed) loses no message."""
        loop = asyncio.get_running_loop()
        with self._ready:
            if self._items:
                return self._take()
            waiter = loop.create_future()
            entry = (loop, waiter)
            self._waiters.append(entry)
        timer = None if timeout is None else loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            with self._ready:
                self._waiters.remove(entry)
        with self._ready:
            return self._take() if self._items else None
