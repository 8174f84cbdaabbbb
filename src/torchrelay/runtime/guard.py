"""Step guard: decides whether the step in flight may commit.

Invariant 3 of DESIGN.md: a rank applies the optimizer only if every collective of the step
completed without error. Collectives that fail, or that are still pending when the controller
aborts the generation, *poison* the step; a poisoned step's optimizer call is skipped and the
step is recomputed after recovery.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch


class GenerationAborted(RuntimeError):
    """The controller aborted the generation this rank was recovering into."""


class StepGuard:
    """Tracks the health of the current step and of the current generation. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation = -1
        self.poison_reason: str | None = None
        self.optimizer_applied = False
        # A hosted rank's accumulating pass (runtime.hosting): the optimizer waits for the
        # host's own pass, which applies the summed gradients once.
        self.accumulating = False
        self._aborted = False
        self._aborted_upto = -1
        self._pending: dict[int, tuple[float, Callable[[bool], None]]] = {}
        self._next_id = 0

    @property
    def poisoned(self) -> bool:
        return self.poison_reason is not None

    @property
    def aborted(self) -> bool:
        """The controller aborted this generation: stop at the next chance and recover."""
        return self._aborted

    def begin_step(self) -> None:
        self.poison_reason = None
        self.optimizer_applied = False

    def enter_generation(self, generation: int) -> None:
        with self._lock:
            self.generation = generation
            # An abort can overtake the plan it cancels: remember it for when we get there.
            self._aborted = generation <= self._aborted_upto
            self.poison_reason = None

    def poison(self, reason: str) -> None:
        with self._lock:
            if self.poison_reason is None:
                self.poison_reason = reason

    def abort(self, generation: int) -> None:
        """Release every pending collective of ``generation`` as failed."""
        with self._lock:
            self._aborted_upto = max(self._aborted_upto, generation)
            if generation != self.generation:
                return
            self._aborted = True
            if self.poison_reason is None:
                self.poison_reason = f"generation {generation} aborted by the controller"
            pending = [settle for _, settle in self._pending.values()]
            self._pending.clear()
        for settle in pending:
            settle(False)

    def oldest_wait(self) -> float | None:
        """Seconds the oldest pending collective has waited (``None``: nothing pending)."""
        with self._lock:
            started = min((t for t, _ in self._pending.values()), default=None)
        return None if started is None else time.monotonic() - started

    def wait_works(self, works: list[Any], after_each: Callable[[int], None]) -> None:
        """Wait for point-to-point works (which have no futures in gloo) unless aborted first.

        A daemon thread waits on them in order and calls ``after_each(i)`` as each completes;
        if the generation is aborted, the caller is released with :class:`GenerationAborted`
        and the thread is left to the group's timeout.
        """
        done = threading.Event()
        errors: list[BaseException] = []

        def wait_all() -> None:
            try:
                for index, work in enumerate(works):
                    work.wait()
                    after_each(index)
            except RuntimeError as exc:
                errors.append(exc)
            done.set()

        ticket = self.track(lambda _ok: done.set())
        if ticket is None:
            raise GenerationAborted(f"generation {self.generation} aborted")
        threading.Thread(target=wait_all, name="torchrelay-transfer-wait", daemon=True).start()
        done.wait()
        self.untrack(ticket)
        if self._aborted:
            raise GenerationAborted(f"generation {self.generation} aborted during transfer")
        if errors:
            raise errors[0]

    def track(self, settle: Callable[[bool], None]) -> int | None:
        """Register a pending collective; ``None`` means: already aborted, settle it now."""
        with self._lock:
            if self._aborted:
                return None
            self._next_id += 1
            self._pending[self._next_id] = (time.monotonic(), settle)
            return self._next_id

    def untrack(self, ticket: int) -> None:
        with self._lock:
            self._pending.pop(ticket, None)


def guard_optimizer(optimizer: torch.optim.Optimizer, guard: StepGuard) -> None:
    """Make ``optimizer.step()`` a no-op while ``guard``'s step is poisoned (or in a hosted
    rank's accumulating pass).

    Records that the optimizer was applied, which commits the step even if a later collective
    of the same step fails (the weights have moved on; recovery then starts from them).
    """
    original = optimizer.step

    # wraps() keeps the markers an LR scheduler put on the step it wrapped.
    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        if guard.poisoned or guard.accumulating:
            return None
        result = original(*args, **kwargs)
        guard.optimizer_applied = True
        return result

    optimizer.step = step  # type: ignore[method-assign]
