"""Every DDP over relay.process_group gets its final bucket layout before the first step,
tracked or not (a replacement must never re-order its buckets while the survivors do not)."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

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
