"""DDP over ``relay.process_group``: one gradient bucket layout on every rank, tracked or not.

DDP re-orders its gradient buckets after its first backward and syncs the new order from
rank 0. A replacement would do that at its first step while the survivors did it long ago:
mismatched collectives (gloo aborts with "Received data size doesn't match expected size").
So every DDP built over the job's stable group gets its final layout before the first step,
identically on every rank, computed locally (the stable group answers locally meanwhile).

The layout is the one DDP would build after a first backward that produces gradients last
parameter first, as a model that uses its parameters in the order it defines them does (DDP's
own assumption for its first buckets): the first bucket holds the last layers, and its
all-reduce runs while the backward computes the first layers'. Built in the parameters' own
order instead, the first bucket held the first layer, whose gradient comes last: no all-reduce
could start before the backward ended (2-3 % of a small MLP's step, docs/benchmarks.md).

``relay.track(model=ddp)`` does it for a tracked DDP; :func:`fix_all_buckets` finds the others
(``relay.track(model=ddp.module)``, or a DDP nobody tracked) when the step loop starts.
"""

from __future__ import annotations

import gc
import weakref

import torch
from torch.nn.parallel import DistributedDataParallel

from torchrelay.runtime.facade import StableProcessGroup

_fixed: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()


def fix_buckets(model: DistributedDataParallel, group: StableProcessGroup) -> None:
    """Give ``model`` (built over ``group``) its final bucket layout now; idempotent.

    A DDP that already rebuilt its buckets (it ran a backward before) keeps them: torch's
    reducer ignores the request then, as it does for ``find_unused_parameters=True``.
    """
    if model in _fixed:
        return
    with group.local():
        if model.static_graph or model.find_unused_parameters:
            # Those record their order in their own first iterations: the parameters' order.
            model.reducer._push_all_rebuilt_params()
        else:
            _run_hooks_last_first(model)
        model.reducer._rebuild_buckets()
    _fixed.add(model)


def _run_hooks_last_first(model: DistributedDataParallel) -> None:
    """Run DDP's gradient hooks once, one zero gradient at a time, last parameter first: DDP
    records that order for its rebuild. Its all-reduces answer locally (the caller's local
    block); each parameter's gradient is put back as it was."""
    params = [p for p in model.module.parameters() if p.requires_grad]
    kept = [p.grad for p in params]
    with torch.enable_grad():
        model.reducer.prepare_for_backward([])
        for param in reversed(params):
            (param * 0).sum().backward()
    for param, grad in zip(params, kept, strict=True):
        param.grad = grad


def fix_all_buckets(group: StableProcessGroup) -> int:
    """Fix the buckets of every live DDP built over ``group`` (found through the garbage
    collector, which tracks every module); returns how many there are. Idempotent."""
    # type(), not isinstance(): a proxy object's __class__ property must not run here.
    found = [
        obj
        for obj in gc.get_objects()
        if issubclass(type(obj), DistributedDataParallel) and obj.process_group is group
    ]
    for model in found:
        fix_buckets(model, group)
    return len(found)
