"""The stable group's steady-state collectives in C++: no Python runs per collective.

DDP calls its process group from C++. When the group is a ``ProcessGroup`` written in Python,
pybind calls back into it for every all-reduce: the GIL, the Python body, the guard's
bookkeeping. On a small model that was 1-2 % of a step (docs/benchmarks.md, "Steady state").
So where the extension is built (:mod:`native`), the stable group registers a C++ backend
(``fast_lane.cpp``) for its all-reduces and broadcasts, and its Python collectives stay the
reference for every other case.

Contract:

- **Armed only by the Python path.** The backend sends a collective to the Python path
  (:class:`~torchrelay.runtime.facade.StableProcessGroup`) unless that path has *armed* it
  with a communicator, after checking every condition under which a collective runs in place
  on it (bound, cuttable, no local answers, not in set-up, no hosting, no launch hook, not
  silenced, not aborted). Every change of those conditions disarms it *after* the change
  (:meth:`FastLane.disarm`), and an arm fails if a disarm came after the caller read
  :attr:`FastLane.epoch`, so an arm never acts on stale state.
- **Armed, a collective** runs in the caller's tensors on the communicator, chained by the
  compiled guard: a failure poisons the step (the step guard keeps every poison in the same
  compiled flag, so a poisoned step's later collectives go to the Python path and are not
  launched). It is registered in flight until its future ends.
- **Abort.** The step guard calls :meth:`FastLane.release` when the generation is aborted:
  it disarms, cuts the communicator of every collective in flight and watches each until it
  ends (:func:`~torchrelay.runtime.collective.watch_end`: a work a cut does not end makes the
  process leave). One that was starting meanwhile is watched by its launcher.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from torchrelay.runtime.collective import watch_end
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard

# Runs a collective on the Python path: (kind, tensors, options) -> work.
SlowPath = Callable[[str, list[Any], Any], dist.Work]


class FastLane:
    """The compiled lane of one stable group; :attr:`backend` is what the group registers."""

    def __init__(
        self,
        module: ModuleType,
        poison: Any,
        size: int,
        slow: SlowPath,
        cut: Callable[[int], None],
    ) -> None:
        self._lane = module.Lane(poison, slow, watch_end)
        self.backend = module.lane_backend(self._lane, size)
        self._cut = cut  # cuts the communicator of a generation (StableProcessGroup.abort)

    @property
    def epoch(self) -> int:
        """Read before checking the conditions an :meth:`arm` relies on."""
        return int(self._lane.epoch)

    def arm(self, inner: dist.ProcessGroup, generation: int, epoch: int) -> bool:
        """Run collectives on ``inner`` (``generation``'s communicator) from now on; ``False``
        if disarmed since ``epoch`` was read."""
        return bool(self._lane.arm(inner, generation, epoch))

    def disarm(self) -> None:
        self._lane.disarm()

    def release(self) -> None:
        """The generation was aborted: disarm, cut what is in flight and watch it end."""
        for generation, future in self._lane.drain():
            self._cut(generation)
            if future is not None:
                watch_end(future)

    def oldest_start(self) -> float | None:
        """``time.monotonic()`` when the oldest collective in flight started."""
        started = self._lane.oldest_start()
        return None if started is None else float(started)

    @property
    def last_launch(self) -> float:
        """``time.monotonic()`` of the lane's latest launch (0: none yet)."""
        return float(self._lane.last_launch)

    @property
    def launched(self) -> int:
        """How many collectives the lane has run."""
        return int(self._lane.launched)


class NativeStableProcessGroup(StableProcessGroup):
    """:class:`StableProcessGroup` with its all-reduces and broadcasts dispatched to the
    compiled fast lane (:mod:`fast_lane`), which falls back to the Python path above."""

    # c10d's own methods (their descriptors, which bind ``self``): pybind then dispatches
    # DDP's calls to the registered backend instead of calling back into Python.
    allreduce = dist.ProcessGroup.__dict__["allreduce"]
    broadcast = dist.ProcessGroup.__dict__["broadcast"]

    def __init__(self, size: int, guard: StepGuard) -> None:
        super().__init__(size, guard)
        compiled = guard.compiled()
        if compiled is None:
            raise ValueError("a NativeStableProcessGroup needs the compiled step guard")
        module, poison = compiled
        slow = functools.partial(_python_path, weakref.ref(self))
        self._lane = FastLane(module, poison, size, slow, self.abort)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        for device in ("cpu", "cuda"):
            self._register_backend(torch.device(device), custom, self._lane.backend)
        self._set_default_backend(custom)
        guard.attach_lane(self._lane)

    @property
    def lane(self) -> FastLane:
        assert self._lane is not None
        return self._lane


def _python_path(
    group: weakref.ref[StableProcessGroup], kind: str, tensors: list[torch.Tensor], opts: Any
) -> dist.Work:
    """A collective the fast lane leaves to the Python path (held weakly: the lane is C++)."""
    stable = group()
    if stable is None:
        raise RuntimeError("torchrelay: a collective on a stable process group that is gone")
    run = StableProcessGroup.allreduce if kind == "allreduce" else StableProcessGroup.broadcast
    return run(stable, tensors, opts)


def stable_group(size: int, guard: StepGuard) -> StableProcessGroup:
    """The job's stable process group: compiled where the guard is (see :mod:`fast_lane`)."""
    if guard.compiled() is None:
        return StableProcessGroup(size, guard)
    return NativeStableProcessGroup(size, guard)
