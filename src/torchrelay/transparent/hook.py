"""The hook injected into every worker of ``torchrelay run --transparent`` (no script change).

:func:`install` (run by the launcher's ``sitecustomize``) patches torch so that an ordinary
torchrun DDP script runs on the relay:

- ``dist.init_process_group(...)`` (any arguments; ``env://`` included) joins the job and makes
  the relay's stable process group the default group (:mod:`torchrelay.runtime.default_group`);
  RANK, WORLD_SIZE and LOCAL_RANK are the slot's, as under torchrun. The script's RNG streams
  are left as they were (the relay seeds nothing in this mode).
- every ``DistributedDataParallel`` over that group gets its final bucket layout at once (see
  :mod:`torchrelay.runtime.ddp`); its forward marks the step as started.
- ``optimizer.step()`` is the **step boundary**: it commits the step to the controller, obeys a
  recovery the controller ordered, and takes the next step's :class:`Boundary` snapshot. A step
  whose collectives failed is **voided** instead (see :mod:`boundary`): its ``optimizer.step()``,
  LR scheduler ``step()`` and ``GradScaler.update()`` do nothing, its RNG, sampler positions and
  DDP buffers go back to the boundary, and the worker recovers (a new generation of the
  communicator) before the script's loop fetches the same batch again.
- every boundary snapshot's RNG streams are mirrored to the slot's file; a clone that takes a
  dead slot takes that slot's data share (:func:`sampler.retarget`) and its RNG streams
  (:mod:`torchrelay.transparent.slot_rng`).
- ``dist.destroy_process_group()`` (or, without it, the script's normal end) reports the job's
  last step done and waits for the job's end.

Refused, with one line: a second live optimizer (the boundary must be one ``step()`` per
training step), and a ``DataLoader`` over a ``DistributedSampler`` with ``num_workers > 0`` (its
workers fetch ahead; a voided step's batch cannot be taken back).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import random
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel
from torch.optim import lr_scheduler
from torch.utils.data import DataLoader, DistributedSampler

from torchrelay.control.claims import OPEN_ENDED
from torchrelay.control.client import ControlError
from torchrelay.control.protocol import ErrorReport, MaxSteps
from torchrelay.runtime import relay as relay_module
from torchrelay.runtime.ddp import fix_buckets
from torchrelay.transparent import sampler
from torchrelay.transparent.boundary import Boundary
from torchrelay.transparent.rng_mirror import Point
from torchrelay.transparent.slot_rng import SlotStreams


class TransparentError(RuntimeError):
    """The script does something the transparent mode cannot make survive a failure."""


class TransparentWorker:
    """Drives a :class:`~torchrelay.runtime.relay.Relay` from the script's own loop: the
    step boundaries are its optimizer steps instead of ``relay.steps()``."""

    def __init__(self, relay: relay_module.Relay) -> None:
        self.relay = relay
        self.modules: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.voided = False  # between a voided optimizer.step() and the next step's start
        self._started = False  # the first step's forward ran: setup is over
        self._finished = False
        self._fetched = False  # the step in flight has fetched from a DistributedSampler
        self._boundary: Boundary | None = None
        self._at: tuple[int, Point] | None = None  # where _boundary was taken
        self.streams = SlotStreams(relay)
        sampler.before_next = self._before_fetch
        relay.on_slot = self._take_slot
        relay._send(MaxSteps(max_steps=OPEN_ENDED))  # the script decides where it ends
        self._begin(0, Point.SETUP)

    # ------------------------------------------------------------ what the script does
    def on_setup(self) -> None:
        """A DDP module or an optimizer was built: before the first step, the boundary of
        step 0 moves here (the script may have seeded its RNG after init_process_group)."""
        if not self._started:
            self._begin(self.relay.committed + 1, Point.SETUP)

    def on_forward(self) -> None:
        self._started = True
        self.voided = False
        if self._boundary is None:
            # The step before fetched from a DistributedSampler and this one did not (the
            # script left its loader loop): its snapshot is taken here, the latest safe point.
            self._snapshot(self.relay._current_step, Point.FORWARD)
        self.relay._maybe_fire("forward")

    def _before_fetch(self) -> None:
        """The step's first batch: its loop iteration starts here. What ran since the
        boundary (the scheduler, epoch-end code, a new epoch's DataLoader iterator, which
        draws a seed from the global RNG) is not run again by a voided step's loop, so the
        snapshot to go back to is this one."""
        if not self._fetched:
            self._fetched = True
            self.voided = False
            self._snapshot(self.relay._current_step, Point.FETCH)

    def optimizer_step(self, run: Callable[[], Any]) -> Any:
        """The step boundary: commit the step (``run`` applies the optimizer) or void it."""
        relay, guard = self.relay, self.relay.guard
        step = relay._current_step
        if step is None or self._finished:
            return run()  # an optimizer step after the script's training ended
        if guard.poisoned and not guard.optimizer_applied:
            self._void(step)
            return None
        result = run()
        guard.optimizer_applied = True
        self._commit(step)
        return result

    def finish(self) -> None:
        """The script's training is over: report the last step done, wait for the job's end."""
        if self._finished:
            return
        self._finished = True
        self.relay._current_step = None
        # The step the last commit began never runs: a timer left running would have the
        # controller judge this rank stalled in it while the job's end waits (a handover).
        self.relay.timer.abandon()
        while not self.relay._finish():
            pass  # a recovery was served meanwhile; report done again

    # ------------------------------------------------------------ boundary
    def _begin(self, step: int, point: Point, snapshot: bool = True) -> None:
        """Start ``step`` at ``point``; its boundary snapshot now, unless ``snapshot`` is false:
        the step will take it before its first fetch (:meth:`_before_fetch`) or, failing that,
        at its first forward (:meth:`on_forward`)."""
        relay = self.relay
        relay.guard.begin_step()
        relay._current_step = step
        self._fetched = False
        self._boundary = None
        if snapshot:
            self._snapshot(step, point)
        relay.timer.start()

    def _snapshot(self, step: int | None, point: Point) -> None:
        """Take the boundary snapshot of ``step`` at ``point`` and mirror its RNG streams to
        this slot's file (:mod:`rng_mirror`). A clone that has just taken a slot first adopts
        the streams the slot's dead rank recorded at the same place: from here on it draws
        what the dead rank would have drawn."""
        if step is None:  # after the script's training: nothing of it is redone or cloned
            self._boundary, self._at = Boundary.take(list(self.modules)), None
            return
        self.streams.adopt_due(step, point)
        self._boundary, self._at = Boundary.take(list(self.modules)), (step, point)
        self.streams.record(self._boundary, step, point)

    def _commit(self, step: int) -> None:
        relay = self.relay
        relay._current_step = None
        relay.committed = step
        relay._last_commit_t = time.time()
        relay.timer.commit(relay.process_group.last_launch())
        relay._report_resumed()
        if relay.guard.poisoned or relay._handover_due():
            relay._recover(in_flight=None)
        # A loop over a DistributedSampler's loader snapshots again before the next step's
        # first fetch, which replaces this one: taking both would double the hook's per-step
        # cost (the numpy RNG state alone takes ~100 µs to read).
        self._begin(step + 1, Point.COMMIT, snapshot=not self._fetched)

    def _void(self, step: int) -> None:
        relay = self.relay
        relay._current_step = None
        relay.timer.abandon()
        assert self._boundary is not None and self._at is not None
        point = self._at[1]  # the loop redoes the step from where its snapshot was taken
        self._boundary.restore(list(self.optimizers))
        self.voided = True
        print(
            f"torchrelay: step {step} voided ({relay.guard.poison_reason}); it runs again "
            "after recovery",
            file=sys.stderr,
            flush=True,
        )
        relay._recover(in_flight=step)
        self._begin(step, point)

    def _take_slot(self, slot: int) -> None:
        """This process (a clone) now holds ``slot``: every ``DistributedSampler`` yields that
        slot's share of the data; its next snapshot adopts the slot's mirrored RNG streams."""
        sampler.retarget(slot)
        self.streams.take(slot)


_worker: TransparentWorker | None = None


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """The relay seeds every RNG when it starts; a transparent script keeps its own streams."""
    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


def _init_process_group(*_args: Any, **_kwargs: Any) -> None:
    global _worker
    if _worker is None:
        with _rng_kept():
            relay = relay_module.join()  # no exit holder: CRIU snapshots this process
        _worker = TransparentWorker(relay)
        _refusals_in_one_line(relay)


def _refusals_in_one_line(relay: relay_module.Relay) -> None:
    """A :class:`TransparentError` ends the worker with its one line, no traceback (it is the
    script's shape that is refused, not a bug at some line of it)."""
    reports = sys.excepthook  # the relay's: it reports the error, then prints the traceback

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not isinstance(exc, TransparentError):
            reports(kind, exc, tb)
            return
        with contextlib.suppress(ControlError):
            error = ErrorReport(step=relay._current_step, traceback=str(exc))
            relay._client.send(error, timeout=5.0)
        print(exc, file=sys.stderr, flush=True)

    sys.excepthook = hook


def _destroying(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> Any:
        if _worker is not None and (group is None or group is _worker.relay.process_group):
            _worker.finish()
        return original(group)

    return destroy_process_group


def _at_exit() -> None:
    # An uncaught exception was reported already (the relay's excepthook): never "done" then.
    if _worker is not None and getattr(sys, "last_value", None) is None:
        _worker.finish()


def _optimizer_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _worker is None:
            return
        if len(_worker.optimizers):
            raise TransparentError(
                "torchrelay --transparent: the script built a second optimizer; the step "
                "boundary is one optimizer.step() per training step (use the model-aware API)"
            )
        _worker.optimizers.add(self)
        stock = self.step

        def step(_self: torch.optim.Optimizer, *a: Any, **kw: Any) -> Any:
            if _worker is None:
                return stock(*a, **kw)
            return _worker.optimizer_step(lambda: stock(*a, **kw))

        # A bound method, as LR schedulers expect when they wrap it in turn.
        self.step = types.MethodType(functools.wraps(stock)(step), self)  # type: ignore[method-assign]
        _worker.on_setup()

    return __init__


def _ddp_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        worker = _worker
        if worker is None or self.process_group is not worker.relay.process_group:
            return
        fix_buckets(self, worker.relay.process_group)
        self.register_forward_pre_hook(lambda *_: worker.on_forward())
        worker.modules.add(self)
        worker.on_setup()

    return __init__


def _skipped_when_voided(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _worker is not None and _worker.voided:
            return None
        return original(self, *args, **kwargs)

    return method


def _loader_iter(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __iter__(self: DataLoader[Any]) -> Any:
        if self.num_workers > 0 and isinstance(self.sampler, DistributedSampler):
            raise TransparentError(
                "torchrelay --transparent: a DataLoader with num_workers > 0 fetches batches "
                "ahead that a voided step cannot take back; use num_workers=0"
            )
        return original(self)

    return __iter__


def install() -> None:
    """Patch torch for the transparent mode (see the module doc); run once, at startup."""
    sampler.patch()
    destroy = _destroying(c10d.destroy_process_group)
    for module in (dist, c10d):
        module.init_process_group = _init_process_group  # type: ignore[assignment]
        module.destroy_process_group = destroy
    torch.optim.Optimizer.__init__ = _optimizer_init(torch.optim.Optimizer.__init__)  # type: ignore[method-assign]
    DistributedDataParallel.__init__ = _ddp_init(DistributedDataParallel.__init__)  # type: ignore[method-assign]
    DataLoader.__iter__ = _loader_iter(DataLoader.__iter__)  # type: ignore[method-assign]
    schedulers = [
        cls
        for cls in vars(lr_scheduler).values()
        if isinstance(cls, type) and "step" in vars(cls) and hasattr(cls, "get_last_lr")
    ]
    for cls in schedulers:
        cls.step = _skipped_when_voided(cls.step)  # type: ignore[method-assign]
    torch.amp.GradScaler.update = _skipped_when_voided(torch.amp.GradScaler.update)  # type: ignore[method-assign]
    atexit.register(_at_exit)
