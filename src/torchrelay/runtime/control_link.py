"""The worker's side of the control plane: reports, the watch stream, heartbeats and the lease.

A mixin of :class:`torchrelay.runtime.relay.Relay`; it relies on the attributes that
``Relay.__init__`` sets (annotated below). Every way of losing the controller ends the process:
a fenced worker or one whose controller is gone must never go on training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import sys
import threading
import traceback
from typing import Any

from torchrelay.control.client import ControlClient, ControlError
from torchrelay.control.endpoint import Endpoint
from torchrelay.control.lease import HEARTBEAT_RPC_TIMEOUT, keep_alive
from torchrelay.control.protocol import (
    Abort,
    ErrorReport,
    Halted,
    Handover,
    Lease,
    Message,
    Progress,
    ProtocolError,
    Report,
    ToldLate,
    WarningReport,
)
from torchrelay.control.report_stream import Lane
from torchrelay.exits import EXIT_CONTROLLER_LOST, EXIT_FENCED, leave
from torchrelay.runtime.default_group import REINIT_ADVICE, is_reinit_error
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard
from torchrelay.runtime.handover_boundary import HandoverBoundary
from torchrelay.runtime.posting import Poster
from torchrelay.runtime.timing import StepTimer

# A worker that has not got a heartbeat through for this many hang timeouts leaves on its own:
# by then the controller has fenced it and handed its slot to another process.
LEASE_FACTOR = 2.0


class ControlLink:
    """Reports to the controller and listens to it (see :class:`Relay`)."""

    generation: int
    committed: int
    guard: StepGuard
    process_group: StableProcessGroup
    timer: StepTimer
    _client: ControlClient
    _inbox: queue.Queue[Message]
    _closing: threading.Event
    _current_step: int | None
    _busy: str | None
    _last_commit_t: float | None
    _waiting: Report | None
    _waiting_lock: threading.RLock
    _handover: HandoverBoundary
    _unparked: threading.Event  # cleared while transparent mode's park closed the connection
    _watch_paused: threading.Event
    _beating: threading.Lock
    _poster: Poster

    def _send(self, report: Report, after_posted: bool = True) -> dict[str, Any]:
        """Send ``report`` from this process's generation (``after_posted``: after the reports
        posted before)."""
        if after_posted:
            self._poster.flush()
        report = dataclasses.replace(report, generation=self.generation)
        if isinstance(report, Halted) and report.last_commit_t is None:
            # How long the survivors stall is measured from their last commit.
            report = dataclasses.replace(report, last_commit_t=self._last_commit_t)
        try:
            return self._client.send(report)
        except ControlError as exc:
            _die_on_control_error(exc)
            raise

    def _post(self, report: Report) -> None:
        """Send ``report`` (from this process's generation now) without waiting for the
        controller: for reports whose answer nobody reads, on the critical path (see
        :mod:`torchrelay.runtime.posting`)."""
        self._poster.post(dataclasses.replace(report, generation=self.generation))

    def _on_new_leader(self, endpoint: Endpoint) -> None:
        """A standby leads the job now (the client moved to it): tell it again what this
        process waits with, since the durable state does not keep the step a halted process
        committed (see :mod:`torchrelay.control.takeover`)."""
        with contextlib.suppress(OSError):
            os.write(2, f"torchrelay: the controller moved to {endpoint.control}\n".encode())
        with self._waiting_lock:
            if self._waiting is not None:
                # Not after what was posted since: the first time, it went before those. And
                # this may run inside a send that holds the stream the poster waits for.
                self._send(self._waiting, after_posted=False)

    def _warn(self, line: str, what: str, objects: tuple[str, ...] = ()) -> None:
        """Loudly: on stderr and in the job's ledger."""
        print(line, file=sys.stderr, flush=True)
        self._send(WarningReport(step=self.committed, message=line, what=what, objects=objects))

    def _watch(self) -> None:
        while True:
            try:
                for message in self._client.watch():
                    if isinstance(message, Abort):
                        self.guard.abort(message.generation)
                        self.process_group.abort(message.generation)
                    if isinstance(message, Handover):
                        # Read by the training thread at its next step boundary.
                        self._handover.tell(message.generation, message.step, self._told_late)
                        continue
                    self._inbox.put(message)
                return
            except ControlError as exc:
                if not self._unparked.is_set():  # parked: the stream was closed on purpose
                    self._watch_paused.set()
                    self._unparked.wait()
                    continue  # on the new connection
                if not self._closing.is_set():
                    _die_on_control_error(exc)
                return
            except ProtocolError as exc:  # a controller of another version: nothing to follow
                leave(EXIT_CONTROLLER_LOST, f"cannot read the controller's message: {exc}")

    def _told_late(self, committed: int) -> None:
        """Told a handover's boundary after committing ``committed`` and passing it: say so
        (a halted peer never joins this rank's step). Posted, so it goes before any report of
        this rank's halt, which is sent after the reports posted before it."""
        self._post(ToldLate(step=committed))

    def _heartbeat(self) -> None:
        """Sign of life and progress, off the training thread (never on the critical path).

        Also a lease (see :mod:`torchrelay.control.lease`): a worker whose heartbeats have not
        got through for ``LEASE_FACTOR`` hang timeouts -- a network partition -- exits, so an
        isolated replica never outlives its fencing.
        """

        def beat() -> float:
            beat = Progress(
                generation=self.generation,
                step=self.committed,
                step_age=self.timer.step_age(),
                waiting=self.guard.oldest_wait(),
                busy=self._busy,
                **self.timer.medians(),
            )
            while True:  # a parked process has no connection: it beats once reconnected
                self._unparked.wait()
                with self._beating:
                    if self._unparked.is_set():
                        reply = self._client.send_on(Lane.HEARTBEATS, beat, HEARTBEAT_RPC_TIMEOUT)
                        return LEASE_FACTOR * Lease.from_wire(reply).hang_timeout

        def expired(silence: float, lease: float, error: ControlError) -> None:
            # Whatever the error (DEADLINE_EXCEEDED from a server that is gone, a cut link):
            # past the lease, the job has gone on without this replica, or is no more.
            leave(
                EXIT_FENCED,
                f"no heartbeat reached the controller for {silence:.1f} s (lease {lease:.1f} s, "
                f"last error {error.code}); this replica is presumed replaced and stops here",
            )

        def failed(exc: ControlError) -> None:
            # With a standby able to take over, a controller out of reach is not the end:
            # the lease decides, as for a partition.
            if exc.code == "FAILED_PRECONDITION" or not self._client.fails_over:
                _die_on_control_error(exc)

        keep_alive(beat, self._closing, failed, expired)


def posted_report_failed(report: Report, exc: Exception) -> None:
    """A posted report failed: the process ends as a synchronous report's failure ends it."""
    if isinstance(exc, ControlError):
        _die_on_control_error(exc)
    leave(1, f"the controller did not take this process's {type(report).TAG} report: {exc}")


def _die_on_control_error(exc: ControlError) -> None:
    if exc.code == "FAILED_PRECONDITION":
        leave(
            EXIT_FENCED,
            f"this process was fenced out of the job and must not continue: {exc.message}",
        )
    if exc.code in ("UNAVAILABLE", "UNKNOWN", "CANCELLED", "DEADLINE_EXCEEDED"):
        leave(
            EXIT_CONTROLLER_LOST,
            f"lost the controller ({exc.code}: {exc.message}); the launcher is gone, exiting",
        )


def install_excepthook(relay: ControlLink) -> None:
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        text = "".join(traceback.format_exception(kind, exc, tb))
        with contextlib.suppress(ControlError):
            relay._client.send(ErrorReport(step=relay._current_step, traceback=text), timeout=5.0)
        previous(kind, exc, tb)
        if is_reinit_error(exc):
            print(REINIT_ADVICE, file=sys.stderr, flush=True)

    sys.excepthook = hook
