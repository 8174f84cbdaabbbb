"""Refusing replayed control requests: one use per nonce, within a freshness window.

Every sealed message carries a random nonce and its sender's clock (see
:mod:`torchrelay.control.wire`). The controller accepts a request only if its
``(sender, nonce)`` was not seen before and its send time is within ``window`` seconds of the
controller's clock. So a captured request (a ``NodeJoin`` that would bring a lost node back, a
``Report`` claiming progress) is refused if replayed at once -- the nonce was seen -- or later
-- it is stale. This assumes the clocks of the job's nodes agree within ``window`` (60 s by
default; NTP keeps them within milliseconds). Nonces are remembered only until their message
would be stale anyway, so memory is bounded by the request rate times twice the window.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable

from torchrelay.control.wire import Sealed, WireError

FRESHNESS_WINDOW = 60.0


class ReplayGuard:
    """Admits each authenticated message once, and only while it is fresh. Thread-safe."""

    def __init__(
        self, window: float = FRESHNESS_WINDOW, clock: Callable[[], float] = time.time
    ) -> None:
        self.window = window
        self._clock = clock
        self._seen: set[tuple[str, str]] = set()
        self._expiry: list[tuple[float, tuple[str, str]]] = []  # heap of (forget at, key)
        self._lock = threading.Lock()

    def admit(self, sender: str, message: Sealed) -> None:
        """Record ``message`` from ``sender``; raise :class:`WireError` if replayed or stale."""
        now = self._clock()
        skew = now - message.sent
        if not math.isfinite(skew) or abs(skew) > self.window:
            raise WireError(
                f"stale control request refused: sent {skew:+.1f} s from the controller's clock, "
                f"outside the {self.window:.0f} s freshness window (a replay, or node clocks "
                "that disagree: synchronize them with NTP)",
                reason="stale",
            )
        key = (sender, message.nonce)
        with self._lock:
            self._forget(now)
            if key in self._seen:
                raise WireError(
                    f"replayed control request refused: {sender!r} already sent nonce "
                    f"{message.nonce[:16]}",
                    reason="replayed",
                )
            self._seen.add(key)
            # Once the message is older than the window it is refused as stale: forget it then.
            heapq.heappush(self._expiry, (message.sent + self.window, key))

    def __len__(self) -> int:
        """How many nonces are remembered now."""
        with self._lock:
            self._forget(self._clock())
            return len(self._seen)

    def _forget(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] < now:
            _, key = heapq.heappop(self._expiry)
            self._seen.discard(key)
