"""Counting refused control requests without letting them grow the ledger.

Anyone who can reach the control port can send garbage; each refusal used to be one ledger line,
so a flood grew the ledger without bound. Now every refusal is counted by reason
(``malformed``, ``unauthenticated``, ``replayed``, ``stale``), the first
:data:`SAMPLES` of each reason are written in full (``rejected_message``), and after that one
``rejected_summary`` line each time a reason's count reaches a power of two: a flood of ``n``
requests costs ``SAMPLES + log2(n)`` lines per reason. The counts go into the controller's
``status()`` and its ``job_end`` event.
"""

from __future__ import annotations

import threading

from torchrelay.events import Rejected, RejectedSummary
from torchrelay.ledger import Ledger

SAMPLES = 5


def worth_a_line(count: int) -> type[Rejected] | None:
    """Which ledger line the ``count``-th refusal of a reason gets: a sample, a summary, none."""
    if count <= SAMPLES:
        return Rejected
    if count & (count - 1) == 0:
        return RejectedSummary
    return None


class Rejections:
    """Per-reason counts of refused requests, with a bounded sample in the ledger. Thread-safe."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, reason: str, detail: str, peer: str) -> None:
        """Count one refused request; write it to the ledger if it is a sample or a milestone."""
        with self._lock:
            count = self._counts[reason] = self._counts.get(reason, 0) + 1
        event = worth_a_line(count)
        if event is not None:
            line = event(reason=reason, count=count, detail=detail, peer=peer)
            self._ledger.write(line.to_json())

    def counts(self) -> dict[str, int]:
        """Refusals so far by reason (empty when there were none)."""
        with self._lock:
            return dict(self._counts)
