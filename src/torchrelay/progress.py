"""Progress lines for long operations (a state transfer, a wait for a spare), throttled.

A short operation says nothing: a line appears only once the operation has run for
``quiet_for`` seconds, then at most once every ``every`` seconds, and -- if anything was said --
once more when it completes. The clock is injected, so the throttle is tested without waiting.

Imports neither torch nor the controller.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

Clock = Callable[[], float]
Emit = Callable[[str], None]

MB = 1 << 20


def to_stderr(line: str) -> None:
    """Print ``line`` on stderr; never raises (the reader of the pipe may be gone)."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


class Throttle:
    """Says when a progress line is due: after ``quiet_for`` seconds, then every ``every``."""

    def __init__(self, clock: Clock = time.monotonic, quiet_for: float = 1.0, every: float = 1.0):
        self._clock = clock
        self._every = every
        self.started = clock()
        self._next = self.started + quiet_for
        self.spoke = False  # whether a line was due at least once

    def elapsed(self) -> float:
        return self._clock() - self.started

    def due(self) -> bool:
        """Whether a line is due now; if so, the next one is due ``every`` seconds later."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._every
        self.spoke = True
        return True


def bytes_line(label: str, done: int, total: int, seconds: float) -> str:
    """``"LABEL: 412/1024 MB (40 %, 3 s)"``; MB with one decimal below 10 MB."""
    digits = 1 if total < 10 * MB else 0
    share = 100.0 * done / total if total else 100.0
    return (
        f"{label}: {done / MB:.{digits}f}/{total / MB:.{digits}f} MB "
        f"({share:.0f} %, {seconds:.0f} s)"
    )


class ByteProgress:
    """Progress of moving ``total`` bytes: call :meth:`add` as pieces land.

    Emits :func:`bytes_line` lines through ``emit`` as :class:`Throttle` allows, and a last one
    when the count reaches ``total`` if any was emitted before.
    """

    def __init__(
        self,
        label: str,
        total: int,
        emit: Emit = to_stderr,
        clock: Clock = time.monotonic,
        quiet_for: float = 1.0,
        every: float = 1.0,
    ) -> None:
        self.label, self.total, self.done = label, total, 0
        self._emit = emit
        self._throttle = Throttle(clock, quiet_for, every)

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        finished = self.done >= self.total
        if (finished and self._throttle.spoke) or (not finished and self._throttle.due()):
            seconds = self._throttle.elapsed()
            self._emit(bytes_line(self.label, self.done, self.total, seconds))
