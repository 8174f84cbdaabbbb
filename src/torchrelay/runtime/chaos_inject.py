"""Chaos injection inside a worker: fires the faults of ``--chaos`` at their step and phase.

A mixin of :class:`torchrelay.runtime.relay.Relay` (see :mod:`torchrelay.chaos` for the spec).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from torchrelay.chaos import ChaosEvent
from torchrelay.control.protocol import ChaosFired
from torchrelay.runtime.facade import StableProcessGroup


class ChaosInjection:
    """Fires this process's chaos events (see :class:`Relay`)."""

    process_group: StableProcessGroup
    _chaos: list[ChaosEvent]
    _current_step: int | None

    def _set_chaos(self, events: list[ChaosEvent]) -> None:
        """This process's chaos events from now on. Only a backward-phase one needs a hook
        on each all-reduce's launch (which keeps them on the stable group's Python path)."""
        self._chaos = events
        backward = any(e.phase == "backward" and e.action != "slow" for e in events)
        hook = (lambda: self._maybe_fire("backward")) if backward else None
        self.process_group.after_allreduce_launch = hook

    def _maybe_fire(self, phase: str, step: int | None = None) -> None:
        step = self._current_step if step is None else step
        if step is None:
            return
        for event in self._chaos:
            if event.action == "slow" and step >= event.step and phase == "forward":
                if step == event.step:
                    self._send(ChaosFired(id=event.id))
                # The injected fault itself: this rank computes slower from now on.
                time.sleep(event.seconds)
            elif event.step == step and event.phase == phase and event.action != "slow":
                self._send(ChaosFired(id=event.id))
                self._inject(event.action)

    def _inject(self, action: str) -> None:
        if action == "drop":
            self.process_group.silence()
        elif action == "stall":
            # The training thread blocks for good; the heartbeat thread goes on.
            threading.Event().wait()
        elif action == "freeze":
            freeze()
        else:
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)


def freeze() -> None:
    """Never return, holding the GIL: no thread of this process runs Python again.

    A C call that blocks without releasing the GIL: locking a mutex this thread already
    holds. A signal does not end the wait (POSIX has a mutex wait resume after the handler),
    where it ended a ``sleep()``: the fence's stack-dump signal woke a frozen worker, which then
    ran on. Only SIGKILL, or a signal that ends the process, ends it."""
    libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER, a normal mutex
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
