"""Data order is a pure function of (seed, epoch, step, rank): exactly once after recovery."""

import pytest
import torch
from torch.utils.data import TensorDataset

from torchrelay.runtime.data import batch_indices, step_loader, steps_per_epoch
from torchrelay.runtime.rng import seed_all, seed_for


def test_each_sample_used_once_per_epoch_across_ranks_and_steps():
    n, batch, world = 100, 4, 3
    per_epoch = steps_per_epoch(n, batch, world)
    seen = [
        i
        for step in range(per_epoch)
        for rank in range(world)
        for i in batch_indices(n, batch, world, rank, seed=5, step=step)
    ]
    assert len(seen) == len(set(seen)) == per_epoch * batch * world


def test_epochs_are_reshuffled():
    first = batch_indices(100, 4, 2, 0, seed=1, step=0)
    next_epoch = batch_indices(100, 4, 2, 0, seed=1, step=steps_per_epoch(100, 4, 2))
    assert first != next_epoch


def test_loader_resumed_at_a_step_matches_the_uninterrupted_one():
    data = TensorDataset(torch.arange(200).float())
    full = step_loader(data, 5, 4, rank=2, seed=3, start_step=0)
    batches = [next(full)[0] for _ in range(12)]
    resumed = step_loader(data, 5, 4, rank=2, seed=3, start_step=7)
    for expected in batches[7:]:
        assert torch.equal(next(resumed)[0], expected)


def test_dataset_smaller_than_a_global_batch_is_refused():
    with pytest.raises(ValueError, match="fewer than one global batch"):
        steps_per_epoch(7, 4, 2)


def test_rng_streams_depend_on_step_and_rank_only():
    assert seed_for(1, 5, 2) == seed_for(1, 5, 2)
    assert len({seed_for(1, 5, 2), seed_for(1, 6, 2), seed_for(1, 5, 3), seed_for(2, 5, 2)}) == 4
    seed_all(1, 5, 2)
    a = torch.rand(3)
    seed_all(1, 5, 2)
    assert torch.equal(a, torch.rand(3))
