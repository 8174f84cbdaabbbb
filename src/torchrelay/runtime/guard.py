"""Step guard: decides whether the step in flight may commit.

Invariant 3 of DESIGN.md: a rank applies the optimizer only if every collective of the step
completed without error. Collectives that fail, or that are still pending when the controller
aborts the generation, *poison* the step; a poisoned step's optimizer call is skipped and the
step is recomputed after recovery.
"""

from __future__ import annotations

import datetime
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch.futures import Future

from torchrelay.runtime import native

if TYPE_CHECKING:
    from torchrelay.runtime.fast_lane import FastLane

# "0": collectives complete through the Python callback even where the extension is built.
NATIVE_SWITCH = "TORCHRELAY_NATIVE_GUARD"

# What an abort does with a pending collective, given its future (None: not started yet).
Settle = Callable[["Future[Any] | None"], None]


class GenerationAborted(RuntimeError):
    """The controller aborted the generation this rank was recovering into."""


class StepGuard:
    """Tracks the health of the current step and of the current generation. Thread-safe.

    A failed collective poisons the step from gloo's thread, through :meth:`poison` or, for
    the collectives :meth:`chain_native` and the fast lane complete, through the compiled
    guard's flag (``native_guard.cpp``, in :mod:`native`). Where that flag exists it holds
    every poison, so that the fast lane sees a step poisoned by any cause.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation = -1
        self._reason: str | None = None
        self.optimizer_applied = False
        # No step has begun yet: the script is setting up (DDP's constructor, its own
        # collectives), where a failed collective is answered locally (see facade).
        self.setting_up = True
        # A hosted rank's accumulating pass (runtime.hosting): the optimizer waits for the
        # host's own pass, which applies the summed gradients once.
        self.accumulating = False
        self._aborted = False
        self._aborted_upto = -1
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._native = native.load() if os.environ.get(NATIVE_SWITCH, "1") != "0" else None
        self._native_poison = None if self._native is None else self._native.Poison()
        self._lane: FastLane | None = None

    @property
    def poisoned(self) -> bool:
        if self._native_poison is not None:
            return bool(self._native_poison.set)
        return self._reason is not None

    @property
    def poison_reason(self) -> str | None:
        """Why the step is poisoned (the first failure's reason); ``None`` if it is not."""
        if self._native_poison is not None:
            return str(self._native_poison.reason) if self._native_poison.set else None
        return self._reason

    @property
    def aborted(self) -> bool:
        """The controller aborted this generation: stop at the next chance and recover."""
        return self._aborted

    @property
    def native(self) -> bool:
        """Whether collectives complete through the compiled guard (:meth:`chain_native`)."""
        return self._native is not None

    def compiled(self) -> tuple[ModuleType, Any] | None:
        """The extension and this guard's compiled poison flag (``None``: not compiled), for
        a :class:`~torchrelay.runtime.fast_lane.FastLane`."""
        if self._native is None:
            return None
        return self._native, self._native_poison

    def attach_lane(self, lane: FastLane) -> None:
        """``lane`` runs collectives of this guard's steps: it is disarmed when the generation
        changes and released when it is aborted."""
        self._lane = lane

    def begin_step(self) -> None:
        with self._lock:
            self.setting_up = False
            self._clear_poison()
            self.optimizer_applied = False

    def enter_generation(self, generation: int) -> None:
        with self._lock:
            self.generation = generation
            # An abort can overtake the plan it cancels: remember it for when we get there.
            self._aborted = generation <= self._aborted_upto
            self._clear_poison()
        if self._lane is not None:
            self._lane.disarm()

    def _clear_poison(self) -> None:
        """Clear the last step's poison, but not an abort's: every step that begins in an
        aborted generation is poisoned. (An abort that came between the step loop's look at
        :attr:`aborted` and :meth:`begin_step` once left such a step unpoisoned: its
        collectives were skipped, and its optimizer applied this rank's own gradients.)"""
        self._reason = None
        if self._native_poison is not None:
            self._native_poison.clear()
        if self._aborted:
            self._mark(self._abort_reason())

    def _abort_reason(self) -> str:
        return f"generation {self.generation} aborted by the controller"

    def poison(self, reason: str) -> None:
        with self._lock:
            self._mark(reason)

    def _mark(self, reason: str) -> None:
        """Poison the step unless it is already (the first reason is kept); lock held."""
        if self._native_poison is not None:
            self._native_poison.mark(reason)
        elif self._reason is None:
            self._reason = reason

    def chain_native(self, inner: Future[Any], outputs: list[torch.Tensor]) -> Future[Any] | None:
        """``inner``'s future chained by the compiled guard: it completes with ``inner``'s
        value, or, if ``inner`` fails, poisons the step and completes with ``outputs``; no
        Python runs on completion. ``None`` where the guard is not compiled (the caller then
        chains a Python callback that does the same)."""
        if self._native is None:
            return None
        return self._native.guarded(inner, outputs, self._native_poison)

    def abort(self, generation: int) -> None:
        """Release every pending collective of ``generation`` as failed."""
        with self._lock:
            self._aborted_upto = max(self._aborted_upto, generation)
            if generation != self.generation:
                return
            self._aborted = True
            self._mark(self._abort_reason())
            self._forget_ended()
            pending, self._pending = list(self._pending.values()), {}
        if self._lane is not None:
            self._lane.release()
        for entry in pending:
            entry.settle(entry.future)

    def oldest_wait(self) -> float | None:
        """Seconds the oldest pending collective has waited (``None``: nothing pending)."""
        with self._lock:
            self._forget_ended()
            starts = [p.started for p in self._pending.values()]
        fast = None if self._lane is None else self._lane.oldest_start()
        if fast is not None:
            starts.append(fast)
        started = min(starts, default=None)
        return None if started is None else time.monotonic() - started

    def wait_works(
        self, works: list[Any], after_each: Callable[[int], None], timeout: datetime.timedelta
    ) -> None:
        """Wait for point-to-point works (which have no futures in gloo) unless aborted first.

        A daemon thread waits on them in order, each up to ``timeout``, and calls
        ``after_each(i)`` as each completes; if the generation is aborted, the caller is
        released with :class:`GenerationAborted` and the thread is left to that timeout.
        (Without one, a gloo send or receive waits as long as the group's constructor was
        given, which bounds its rendezvous: seconds, see :func:`devices.new_group`.)
        """
        done = threading.Event()
        errors: list[BaseException] = []

        def wait_all() -> None:
            try:
                for index, work in enumerate(works):
                    work.wait(timeout)
                    after_each(index)
            except RuntimeError as exc:
                errors.append(exc)
            done.set()

        ticket = self.track(lambda _future: done.set())
        if ticket is None:
            raise GenerationAborted(f"generation {self.generation} aborted")
        threading.Thread(target=wait_all, name="torchrelay-transfer-wait", daemon=True).start()
        done.wait()
        self.untrack(ticket)
        if self._aborted:
            raise GenerationAborted(f"generation {self.generation} aborted during transfer")
        if errors:
            raise errors[0]

    def track(self, settle: Settle) -> int | None:
        """Register a pending collective; ``None`` means: already aborted, settle it now.

        An abort of the generation calls ``settle`` with the collective's future (``None`` if
        it has not started yet); a collective whose future ended is no longer pending."""
        with self._lock:
            if self._aborted:
                return None
            self._forget_ended()
            self._next_id += 1
            self._pending[self._next_id] = _Pending(time.monotonic(), settle)
            return self._next_id

    def launched(self, ticket: int, future: Future[Any]) -> bool:
        """The tracked collective started, and ``future`` ends with it: it stops being pending
        then, with no call back here. ``False``: an abort settled it meanwhile (with no future
        to watch; the caller watches it)."""
        with self._lock:
            entry = self._pending.get(ticket)
            if entry is None:
                return False
            entry.future = future
            return True

    def untrack(self, ticket: int) -> None:
        with self._lock:
            self._pending.pop(ticket, None)

    def _forget_ended(self) -> None:
        """Drop the collectives that ended (a chained collective's future says so, and holds
        its outputs until dropped): the registry is the collectives in flight and no more.
        Called with the lock held."""
        self._pending = {k: p for k, p in self._pending.items() if not p.ended()}


@dataclass
class _Pending:
    """A tracked collective: when it started, what an abort does with it, and its future once
    it started (it has ended when that future is done)."""

    started: float
    settle: Settle
    future: Future[Any] | None = None

    def ended(self) -> bool:
        return self.future is not None and self.future.done()


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
