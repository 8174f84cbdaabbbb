"""Every DDP over relay.process_group gets its final bucket layout before the first step,
tracked or not (a replacement must never re-order its buckets while the survivors do not)."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.gloo_pair import plain_group
from torchrelay.runtime.ddp import fix_all_buckets
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard


def _ddp(group: StableProcessGroup) -> DDP:
    # A group without a communicator answers locally, as on a spare during its setup.
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    return DDP(net, process_group=group)


def _would_rebuild(model: DDP, group: StableProcessGroup) -> bool:
    """Whether torch would still re-order this DDP's buckets (it does so once only)."""
    with group.local():
        model.reducer._push_all_rebuilt_params()
        return bool(model.reducer._rebuild_buckets())


def test_untracked_ddps_over_the_relay_group_are_fixed_once_and_others_left_alone():
    ours, other = StableProcessGroup(2, StepGuard()), StableProcessGroup(2, StepGuard())
    inner_tracked_only, foreign = _ddp(ours), _ddp(other)
    assert fix_all_buckets(ours) == 1
    assert fix_all_buckets(ours) == 1  # idempotent: found again, not fixed again
    assert not _would_rebuild(inner_tracked_only, ours)
    assert _would_rebuild(foreign, other)


def _layout(model: DDP) -> list[list[int]]:
    """The indices of each bucket's parameters, in the reducer's bucket order."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    buckets = model.reducer._get_zeros_like_grad_buckets()
    return [[index[id(p)] for p in bucket.parameters()] for bucket in buckets]


def test_the_fixed_layout_is_the_one_a_first_backward_gives_plain_ddp():
    """Last layers first: their bucket's all-reduce overlaps the rest of the backward. In the
    parameters' own order, the first bucket waited for the first layer's gradient, the last
    one computed, and no all-reduce overlapped the backward."""

    def model(group: torch.distributed.ProcessGroup) -> DDP:
        torch.manual_seed(0)
        layers = [torch.nn.Linear(256, 256) for _ in range(4)]  # 256 KiB: 2 layers a bucket
        return DDP(torch.nn.Sequential(*layers), process_group=group, bucket_cap_mb=0.4)

    plain = model(plain_group(torch.distributed.HashStore(), 0, 1))
    plain(torch.ones(2, 256)).sum().backward()
    plain.reducer._rebuild_buckets()  # what plain DDP's next forward does
    group = StableProcessGroup(1, StepGuard())
    fixed = model(group)
    fix_all_buckets(group)
    assert _layout(fixed) == _layout(plain)
    assert _layout(plain)[0][0] == 7  # the last layer's bias: its gradient comes first
    assert [p.grad for p in fixed.parameters()] == [None] * 8  # no gradient left behind
