"""A process that hosts other ranks' micro-batches (``torchrelay run --elastic``, shrunk).

The logical world keeps its ``N`` ranks; the process group underneath has one member per
process. A host runs, at each step, one *accumulating pass* per hosted rank (that rank's batch,
RNG and rank number) and then its own pass:

- in an accumulating pass an all-reduce does not communicate: its input (DDP's bucket, already
  divided by ``N``) is kept by :class:`Contributions` and the tensor keeps its local value;
  every other collective is answered locally (a broadcast keeps the local value, an all-gather
  replicates it, a barrier completes); ``optimizer.step()`` is skipped (see
  :class:`~torchrelay.runtime.guard.StepGuard`), and the small tracked state a pass may change
  (LR schedulers, optimizer hyper-parameters) is put back after it;
- in the own pass the ``k``-th all-reduce first combines the ``k``-th kept contribution of each
  hosted pass into its input (a sum for ``SUM``), then runs among the processes.

So each all-reduce sums the same ``N`` contributions as in the full-size job; only the order of
the float additions differs (the host adds its hosted ranks' contributions to its own before the
collective). A script must run the same sequence of all-reduces (count, shapes, ops) for every
rank, as SPMD code does; a mismatch stops the worker with a one-line error
(:class:`HostingError`).

:func:`comm_layout` maps each logical rank to the member of the process group that runs it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist


class HostingError(RuntimeError):
    """A hosted rank's pass ran other all-reduces than the host's own pass."""


def comm_layout(
    world_size: int, members: tuple[int, ...], hosted: dict[int, int]
) -> tuple[int, ...]:
    """The process-group rank that runs each logical rank: ``members`` are the slots with a
    process of their own (their order is the group's), ``hosted`` maps the others to their
    host's slot."""
    index = {slot: i for i, slot in enumerate(members)}
    return tuple(index[r] if r in index else index[hosted[r]] for r in range(world_size))


_COMBINE: dict[object, Callable[[torch.Tensor, torch.Tensor], object]] = {
    dist.ReduceOp.SUM: lambda out, kept: out.add_(kept),
    dist.ReduceOp.MAX: lambda out, kept: torch.maximum(out, kept, out=out),
    dist.ReduceOp.MIN: lambda out, kept: torch.minimum(out, kept, out=out),
    dist.ReduceOp.PRODUCT: lambda out, kept: out.mul_(kept),
}


def _op_key(op: object) -> object:
    """The ``RedOpType`` of a ``ReduceOp`` (an all-reduce's options carry a ``ReduceOp``)."""
    return getattr(op, "op", op)


class Contributions:
    """The all-reduce inputs kept in a step's accumulating passes, combined into the own
    pass's all-reduces in order. Thread-safe (DDP launches all-reduces from autograd threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passes: list[list[tuple[object, list[torch.Tensor]]]] = []
        self._recording: list[tuple[object, list[torch.Tensor]]] | None = None
        self._used = 0

    @property
    def recording(self) -> bool:
        return self._recording is not None

    def begin_step(self) -> None:
        """Forget what an earlier (committed or dropped) step kept."""
        with self._lock:
            self._passes, self._recording, self._used = [], None, 0

    def start_pass(self) -> None:
        with self._lock:
            self._recording = []

    def end_pass(self) -> None:
        with self._lock:
            assert self._recording is not None
            self._passes.append(self._recording)
            self._recording = None

    def keep(self, tensors: list[torch.Tensor], op: object) -> None:
        """An accumulating pass's all-reduce: keep a copy of its input."""
        with self._lock:
            assert self._recording is not None
            self._recording.append((_op_key(op), [t.detach().clone() for t in tensors]))

    def combine(self, tensors: list[torch.Tensor], op: object) -> None:
        """The own pass's next all-reduce: combine every pass's matching contribution into
        ``tensors`` in place (nothing when no rank is hosted)."""
        with self._lock:
            if not self._passes:
                return
            index, self._used = self._used, self._used + 1
            key = _op_key(op)
            combine = _COMBINE.get(key)
            for number, kept_pass in enumerate(self._passes):
                if index >= len(kept_pass):
                    raise HostingError(
                        f"all-reduce #{index + 1} of this step has no counterpart in hosted pass "
                        f"#{number + 1}: every rank must run the same all-reduces"
                    )
                kept_op, kept = kept_pass[index]
                shapes = [t.shape for t in tensors] == [t.shape for t in kept]
                if kept_op != key or not shapes or combine is None:
                    raise HostingError(
                        f"all-reduce #{index + 1} differs from hosted pass #{number + 1}'s (op "
                        f"{key} vs {kept_op}, or shapes), or its op cannot be combined locally"
                    )
                for out, value in zip(tensors, kept, strict=True):
                    combine(out, value.to(out.device))

    def check_used(self) -> None:
        """After a committed step: every kept contribution was combined."""
        with self._lock:
            left = [len(p) - self._used for p in self._passes if len(p) != self._used]
            if left:
                raise HostingError(
                    f"a hosted pass ran {self._used + left[0]} all-reduces, the own pass "
                    f"{self._used}: every rank must run the same all-reduces"
                )
