"""A process hosting another rank (``--elastic``, shrunk), on real gloo groups: the accumulating
pass keeps its all-reduce inputs and answers other collectives locally, the own pass adds them
before the collective among the processes, broadcasts and all-gathers follow the layout."""

from __future__ import annotations

import pytest
import torch
from torch._C._distributed_c10d import BroadcastOptions

from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard, guard_optimizer
from torchrelay.runtime.hosting import Contributions, HostingError, comm_layout


def test_the_layout_maps_each_rank_to_the_member_that_runs_it():
    assert comm_layout(3, (0, 1, 2), {}) == (0, 1, 2)
    assert comm_layout(3, (0, 2), {1: 0}) == (0, 0, 1)
    assert comm_layout(4, (1, 3), {0: 3, 2: 1}) == (1, 0, 0, 1)


def _hosting(pg, member: int) -> tuple[StableProcessGroup, StepGuard]:
    """Slots 0 and 2 of a 3-rank job on a 2-process group; slot 0's process hosts rank 1."""
    guard = StepGuard()
    facade = StableProcessGroup(3, guard)
    slot = (0, 2)[member]
    facade.bind(pg, slot, generation=0)
    facade.set_layout(comm_layout(3, (0, 2), {1: 0}))
    guard.enter_generation(0)
    return facade, guard


def test_an_all_reduce_sums_the_same_contributions_as_the_full_size_job(ranks):
    def body(member, pg):
        facade, guard = _hosting(pg, member)
        facade.contributions.begin_step()
        if member == 0:  # rank 1's accumulating pass, on slot 0's process
            facade.contributions.start_pass()
            hosted = torch.tensor([10.0, 20.0])
            facade.allreduce([hosted]).wait()
            kept_local = hosted.tolist()
            lone = torch.tensor([5.0])
            facade.broadcast([lone]).wait()  # answered locally: the hosted pass has no peers
            facade.contributions.end_pass()
            assert kept_local == [10.0, 20.0] and lone.item() == 5.0
        own = torch.tensor([1.0, 2.0]) if member == 0 else torch.tensor([100.0, 200.0])
        facade.allreduce([own]).wait()
        facade.contributions.check_used()
        return own.tolist(), guard.poisoned

    # 1 + 10 + 100 and 2 + 20 + 200: ranks 0, 1 and 2 of the full-size job.
    assert ranks(2, body) == [([111.0, 222.0], False), ([111.0, 222.0], False)]


def test_broadcasts_and_all_gathers_follow_the_ranks_hosts(ranks):
    def body(member, pg):
        facade, _ = _hosting(pg, member)
        root = torch.tensor([7.0 if member == 0 else 0.0])
        opts = BroadcastOptions()
        opts.rootRank = 1  # rank 1 runs on slot 0's process
        facade.broadcast([root], opts).wait()
        mine = torch.tensor([float(member + 1)])
        outs = [[torch.zeros(1) for _ in range(3)]]
        facade.allgather(outs, [mine]).wait()
        return root.item(), [t.item() for t in outs[0]]

    # Rank 1's entry is its host's (slot 0's process): the replicated state it holds.
    assert ranks(2, body) == [(7.0, [1.0, 1.0, 2.0]), (7.0, [1.0, 1.0, 2.0])]


def test_a_pass_that_runs_other_all_reduces_than_the_own_pass_is_an_error():
    kept = Contributions()
    kept.begin_step()
    kept.start_pass()
    kept.keep([torch.zeros(2)], torch.distributed.ReduceOp.SUM)
    kept.keep([torch.zeros(2)], torch.distributed.ReduceOp.SUM)
    kept.end_pass()
    with pytest.raises(HostingError, match="shapes"):
        kept.combine([torch.zeros(3)], torch.distributed.ReduceOp.SUM)
    kept.begin_step()
    kept.start_pass()
    kept.keep([torch.ones(2)], torch.distributed.ReduceOp.MAX)
    kept.end_pass()
    out = torch.tensor([0.5, 2.0])
    kept.combine([out], torch.distributed.ReduceOp.MAX)
    assert out.tolist() == [1.0, 2.0]
    kept.check_used()
    with pytest.raises(HostingError, match="no counterpart"):
        kept.combine([out], torch.distributed.ReduceOp.MAX)
    kept.begin_step()
    kept.start_pass()
    kept.keep([torch.ones(2)], torch.distributed.ReduceOp.SUM)
    kept.end_pass()
    with pytest.raises(HostingError, match="own pass 0"):
        kept.check_used()


def test_the_optimizer_waits_for_the_own_pass():
    guard = StepGuard()
    weight = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([weight], lr=1.0)
    guard_optimizer(opt, guard)
    weight.grad = torch.ones(1)
    guard.accumulating = True
    opt.step()
    assert weight.item() == 1.0 and not guard.optimizer_applied
    guard.accumulating = False
    opt.step()
    assert weight.item() == 0.0 and guard.optimizer_applied
