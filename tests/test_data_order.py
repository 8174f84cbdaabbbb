"""Data order is a pure function of (seed, epoch, step, rank): exactly once after recovery."""

import random
from itertools import islice

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from torchrelay.runtime.data import (
    batch_indices,
    epoch_length,
    loader_steps_per_epoch,
    sampler_loader,
    step_loader,
    steps_per_epoch,
)
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


def _sampler_loader(world: int = 3):
    data = TensorDataset(torch.arange(100).float())
    # Built as a spare builds it: rank 0, whatever slot it takes later.
    sampler = DistributedSampler(data, num_replicas=world, rank=0, shuffle=True, seed=4)
    return DataLoader(data, batch_size=4, sampler=sampler)


class Noisy(TensorDataset):
    """An augmentation drawn where the loader fetches: in its workers."""

    def __getitem__(self, index):
        (x,) = super().__getitem__(index)
        return x + torch.rand(()) + float(np.random.rand()) + random.random()


def test_a_loader_with_workers_resumed_mid_epoch_augments_each_batch_as_before():
    def loader() -> DataLoader:
        data = Noisy(torch.arange(100).float())
        sampler = DistributedSampler(data, num_replicas=3, rank=0, shuffle=True, seed=4)
        return DataLoader(data, batch_size=4, sampler=sampler, num_workers=2)

    whole = [b.tolist() for b in islice(sampler_loader(loader(), 2, 0), 14)]
    # Batch 11 goes to the other worker, fresh, instead of the one that fetched 9 batches.
    resumed = [b.tolist() for b in islice(sampler_loader(loader(), 2, 11), 3)]
    assert resumed == whole[11:14]


def test_distributed_sampler_loader_resumes_mid_epoch_with_its_slot_rank():
    loader = _sampler_loader()
    per_epoch = loader_steps_per_epoch(loader, world_size=3)
    assert per_epoch == 9  # ceil(100 / 3) = 34 samples per rank, 4 per batch
    whole = [b[0].tolist() for b in islice(sampler_loader(_sampler_loader(), 2, 0), 3 * per_epoch)]
    resumed = [b[0].tolist() for b in islice(sampler_loader(loader, 2, 13), 5)]
    assert resumed == whole[13:18]
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    next(sampler_loader(_sampler_loader(), 1, 4))  # the global RNG (dropout) is left alone
    assert torch.equal(torch.rand(1), expected)
    # The slot's rank, not the one it was built with: disjoint from rank 0's samples.
    rank0 = {
        i for b in islice(sampler_loader(_sampler_loader(), 0, 0), per_epoch) for i in b[0].tolist()
    }
    rank2 = {i for b in whole[:per_epoch] for i in b}
    assert not rank0 & rank2


def test_the_epoch_length_of_what_steps_was_given():
    assert epoch_length(None, None, world_size=2) is None  # relay.steps() with no dataset
    assert epoch_length(TensorDataset(torch.zeros(64, 1)), 4, world_size=2) == 8
    assert epoch_length(_sampler_loader(world=3), None, world_size=3) == 9
    with pytest.raises(ValueError, match="needs batch_size"):
        epoch_length(TensorDataset(torch.zeros(64, 1)), None, world_size=2)


def test_a_loader_without_a_distributed_sampler_is_refused():
    loader = DataLoader(TensorDataset(torch.arange(10).float()), batch_size=2)
    with pytest.raises(ValueError, match="sampler=DistributedSampler"):
        loader_steps_per_epoch(loader, world_size=1)
    with pytest.raises(ValueError, match="num_replicas=3"):
        loader_steps_per_epoch(_sampler_loader(world=3), world_size=2)
