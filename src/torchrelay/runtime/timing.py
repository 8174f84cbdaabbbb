"""Recent step timings of one worker, reported with its heartbeats.

The controller derives its hang timeout from the job's own median step time, and spots
stragglers by comparing the *compute* part of each rank's step (from the step's start to the
launch of its last gradient all-reduce), which excludes the time spent waiting for peers.
"""

from __future__ import annotations

import statistics
import time
from collections import deque


class StepTimer:
    """Medians over the last ``window`` committed steps. Written by the training thread only."""

    def __init__(self, window: int = 20) -> None:
        self._steps: deque[float] = deque(maxlen=window)
        self._compute: deque[float] = deque(maxlen=window)
        self._started = 0.0
        self._running = False

    def start(self) -> None:
        self._started = time.monotonic()
        self._running = True

    def abandon(self) -> None:
        """The step in flight was dropped: it is not timed, and no step is running."""
        self._running = False

    def step_age(self) -> float | None:
        """Seconds since the running step began (``None`` between steps); any thread may ask."""
        return time.monotonic() - self._started if self._running else None

    def commit(self, last_launch: float) -> None:
        """The step committed; ``last_launch``: ``time.monotonic()`` when its last all-reduce
        was launched (earlier than the step's start if it launched none)."""
        now = time.monotonic()
        self._running = False
        self._steps.append(now - self._started)
        self._compute.append(max(last_launch, self._started) - self._started)

    def medians(self) -> dict[str, float]:
        """``step_seconds`` and ``compute_seconds`` (empty before the first committed step)."""
        if not self._steps:
            return {}
        return {
            "step_seconds": statistics.median(self._steps),
            "compute_seconds": statistics.median(self._compute),
        }
