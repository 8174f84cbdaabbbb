"""Heartbeats with a lease: the client half of failure detection.

A worker and a remote node agent both send a heartbeat twice a second. The controller declares
them lost after a timeout of silence measured from the last heartbeat it *received*; the
client measures its lease from the moment it *sent* the last heartbeat that was acknowledged,
which is never later. So an isolated process always knows it is presumed lost no later than
the controller decides it, and can stop itself before its slot is handed to someone else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from torchrelay.control.client import ControlError

HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_RPC_TIMEOUT = 2.0


def keep_alive(
    beat: Callable[[], float | None],
    stop: threading.Event,
    on_error: Callable[[ControlError], None],
    on_expired: Callable[[float, float, ControlError], None],
) -> None:
    """Call ``beat()`` every :data:`HEARTBEAT_INTERVAL` seconds until ``stop`` is set.

    ``beat`` sends one heartbeat and returns the lease the controller granted (seconds, or
    ``None``: no lease yet). A failed heartbeat is passed to ``on_error`` (which may end the
    process: the controller refused it, or is gone); once none has got through for longer
    than the lease, ``on_expired(silence, lease, last_error)`` is called and the loop ends.
    """
    lease: float | None = None
    acked = time.monotonic()
    while not stop.wait(HEARTBEAT_INTERVAL):
        sent = time.monotonic()
        try:
            lease = beat() or lease
            acked = sent
        except ControlError as exc:
            if stop.is_set():
                return
            on_error(exc)
            silence = time.monotonic() - acked
            if lease is not None and silence > lease:
                on_expired(silence, lease, exc)
                return
