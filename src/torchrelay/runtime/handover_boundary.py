"""A planned handover's boundary as one rank sees it (worker side of
:mod:`torchrelay.control.handover`).

The controller tells every rank ``handover(generation, B)``: halt right after committing step
``B``. The message arrives on the watch thread, the training thread looks for it right after
each commit. A rank told after its look at ``B`` (the boundary was set from reports that lagged
it, as on a loaded machine) is inside step ``B + 1``. If a peer heard in time and halted at
``B``, that step's collective never completes: the rank says so at once (``told_late``), and
the controller aborts its step instead of waiting out the hang timeout. Told late, every rank
halts at its next commit.

Thread-safe: :meth:`tell` (watch thread) and :meth:`due` (training thread) share one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class HandoverBoundary:
    """The boundary this rank was told, and the last commit the training thread looked at."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._told: tuple[int, int] | None = None  # (generation, boundary step)
        self._looked: tuple[int, int] | None = None  # (generation, committed step)

    def tell(self, generation: int, step: int, say_late: Callable[[int], None]) -> None:
        """(Watch thread) The controller's boundary. Told too late (this rank committed and
        looked past it: it is inside the next step), ``say_late(committed)`` is called under
        the lock: the training thread cannot halt, and report it, before that is said (it
        must not block)."""
        with self._lock:
            self._told = (generation, step)
            looked = self._looked
            if looked is not None and looked[0] == generation and looked[1] >= step:
                say_late(looked[1])

    def due(self, generation: int, committed: int) -> bool:
        """(Training thread, right after committing ``committed``) Whether this rank halts
        here: its generation's boundary is committed, or passed by a rank told late."""
        with self._lock:
            self._looked = (generation, committed)
            told = self._told
            if told is None or told[0] != generation or committed < told[1]:
                return False
            self._told = None
            return True
