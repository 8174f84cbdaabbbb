"""The controller's two background threads: the liveness monitor and the recovery coordinator.

A mixin of :class:`torchrelay.control.controller.Controller`; it relies on the attributes and
methods the controller sets up (annotated below). Both threads only ever act under the
controller's lock, through the same transition-then-executor path as every request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from torchrelay.config import JobConfig
from torchrelay.control import endings, liveness
from torchrelay.control.actions import Action
from torchrelay.control.persistence import StatePersister
from torchrelay.control.recovery_steps import advance
from torchrelay.control.state import JobState


class Apply(Protocol):
    """``Controller._apply``: carry out actions once the state that decided them is durable."""

    def __call__(self, actions: list[Action], unless_acting: bool = False) -> None: ...


class Coordinator:
    """Monitor and recovery threads (see :class:`Controller`)."""

    job: JobState
    config: JobConfig
    _cond: threading.Condition
    _recovery_thread: threading.Thread | None
    _persister: StatePersister | None
    _store_lost: str | None
    _apply: Apply
    _lose_store: Callable[[str], None]
    _output_tail: Callable[[str], str]

    # ---------------------------------------------------------------- threads
    def start_monitor(self, interval: float = 0.25) -> None:
        """Watch heartbeats (hangs), nodes and step timings (stragglers) in a background
        thread, until the job ends."""
        threading.Thread(
            target=self._monitor, args=(interval,), name="torchrelay-monitor", daemon=True
        ).start()

    def _monitor(self, interval: float) -> None:
        # Ticks by the clock: every transition notifies the condition, and a tick per
        # heartbeat (a full pass over the members) would cost O(ranks) per report.
        with self._cond:
            due = time.monotonic() + interval
            while not self.job.finished:
                left = due - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                due = time.monotonic() + interval
                persister = self._persister
                if persister is not None and self._store_lost is None and persister.lead_lost:
                    # Its lease may be someone else's now: act on nothing more.
                    self._lose_store(f"this controller's lead on {persister.where} ran out")
                    self._cond.notify_all()
                    continue
                actions = liveness.tick(self.job, self.config, time.time(), self._output_tail)
                # A round that finds nothing changes only what the durable state leaves out
                # (the hang timeout, straggler round counts): no O(members) view 4 times a
                # second.
                self._apply(actions, unless_acting=True)
                self._cond.notify_all()

    def _kick_recovery(self) -> None:
        """Run the recovery coordinator unless it runs already (called with the lock held)."""
        if self._recovery_thread is None:
            self._recovery_thread = threading.Thread(
                target=self._recover, name="torchrelay-recovery", daemon=True
            )
            self._recovery_thread.start()

    def _recover(self) -> None:
        """Take the recovery's steps as the state allows, waiting for changes in between."""
        try:
            with self._cond:
                while True:
                    actions, wake = advance(self.job, self.config, time.time())
                    # It wakes on every transition, heartbeats included: a look that decides
                    # nothing is not written (a successor takes the same step from the state
                    # written before), or each heartbeat would cost a write of the state.
                    self._apply(actions, unless_acting=True)
                    self._cond.notify_all()
                    if wake is None:
                        self._recovery_thread = None
                        return
                    self._cond.wait(max(0.0, wake - time.time()))
        except Exception as exc:  # the controller must end the job loudly, never hang it
            with self._cond:
                self._apply(endings.fail(self.job, f"recovery crashed in the controller: {exc!r}"))
                self._recovery_thread = None
                self._cond.notify_all()
