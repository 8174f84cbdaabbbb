"""The facade launches every inner collective asynchronously, whatever the caller asked.

``dist.all_reduce`` and the other blocking calls pass ``asyncOp=False``; ProcessGroupNCCL then
returns no work at all (found on an H200: the replica check's all-gather failed with
"'NoneType' object has no attribute 'get_future'"). The backend below answers as NCCL does.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceOp,
    _create_work_from_future,
)
from torch.futures import Future

from torchrelay.runtime.facade import StableProcessGroup, launch_options
from torchrelay.runtime.guard import StepGuard


class _LikeNccl:
    """A one-member backend that returns ``None`` for a collective called with
    ``asyncOp=False``, as ProcessGroupNCCL does; it doubles an all-reduce's tensors."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def _answer(self, opts: Any, result: Any) -> Any:
        self.seen.append(opts)
        if not opts.asyncOp:
            return None
        future: Future[Any] = Future()
        future.set_result(result)
        return _create_work_from_future(future)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        if opts.asyncOp:
            for t in tensors:
                t.mul_(2)
        return self._answer(opts, tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._answer(opts, tensors)

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        for group, source in zip(outputs, inputs, strict=True):
            for out in group:
                out.copy_(source)
        return self._answer(opts, outputs)

    def barrier(self, opts: Any) -> Any:
        return self._answer(opts, [])


def _blocking(opts: Any) -> Any:
    opts.asyncOp = False
    opts.timeout = datetime.timedelta(seconds=7)
    return opts


def test_blocking_collectives_reach_a_backend_that_returns_no_work_as_asynchronous_ones():
    inner, guard = _LikeNccl(), StepGuard()
    facade = StableProcessGroup(1, guard)
    facade.bind(inner, 0, generation=0)  # type: ignore[arg-type]
    guard.enter_generation(0)
    t = torch.tensor([3.0])
    reduce = _blocking(AllreduceOptions())
    reduce.reduceOp = ReduceOp.MAX
    facade.allreduce([t], reduce).wait()
    facade.broadcast([t], _blocking(BroadcastOptions())).wait()
    outs = [[torch.zeros(1)]]
    facade.allgather(outs, [t], _blocking(AllgatherOptions())).wait()
    facade.barrier(_blocking(BarrierOptions())).wait()

    assert t.item() == 6.0 and outs[0][0].item() == 6.0 and not guard.poisoned
    assert [opts.asyncOp for opts in inner.seen] == [True] * 4
    assert all(opts.timeout == datetime.timedelta(seconds=7) for opts in inner.seen)
    assert inner.seen[0].reduceOp == ReduceOp.MAX
    assert reduce.asyncOp is False  # the caller's options are left as they were


def test_launch_options_copy_every_field_and_leave_the_original():
    opts = BroadcastOptions()
    opts.rootRank, opts.asyncOp = 3, False
    launched = launch_options(opts)
    assert (launched.rootRank, launched.asyncOp) == (3, True)
    launched.rootRank = 1
    assert (opts.rootRank, opts.asyncOp) == (3, False)
