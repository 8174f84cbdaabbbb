"""Reports sent off the training thread, in order: the control RPC leaves the critical path.

A report to the controller is a gRPC call of 1-2 ms on a loaded 2-core node. The reports a
recovery sends just before the training thread computes again (``transfer_done``, then the
first step's commit) would each hold the first step back by that much, for an answer nobody
reads. :class:`Poster` sends such reports from one thread of its own, in the order they were
posted; a report sent synchronously afterwards waits for the posted ones first
(:meth:`Poster.flush`), so the controller sees one process's reports in the order the process
made them, as before.

Failure behaviour: a posted report whose sending raises is handed to ``on_error`` with the
exception, on the poster's thread (the caller's policy; the worker's ends the process, as an
exception of a synchronous report would have); the reports after it are still sent, and
:meth:`flush` never waits for one that failed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from torchrelay.control.protocol import Report


class Poster:
    """One sender thread, a FIFO of reports, and a count of those not sent yet."""

    def __init__(
        self,
        send: Callable[[Report], Any],
        on_error: Callable[[Report, Exception], None],
    ) -> None:
        self._send = send
        self._on_error = on_error
        self._queue: queue.Queue[Report] = queue.Queue()
        self._unsent = 0
        self._drained = threading.Condition()
        # Started now, not at the first post: that one comes in a recovery's critical path.
        self._thread = threading.Thread(target=self._run, name="torchrelay-poster", daemon=True)
        self._thread.start()

    def post(self, report: Report) -> None:
        """Queue ``report``; it is sent after every report posted before it."""
        with self._drained:
            self._unsent += 1
        self._queue.put(report)

    def flush(self) -> None:
        """Return once every report posted so far has been sent (or has failed). On the
        poster's own thread (a report sent from a callback of the one being sent: a new
        leader's) it returns at once: waiting there would wait for itself."""
        if threading.current_thread() is self._thread:
            return
        with self._drained:
            self._drained.wait_for(lambda: self._unsent == 0)

    def _run(self) -> None:
        while True:
            report = self._queue.get()
            try:
                self._send(report)
            except Exception as exc:  # a report's failure must not end the sender thread
                self._on_error(report, exc)
            finally:
                with self._drained:
                    self._unsent -= 1
                    self._drained.notify_all()
