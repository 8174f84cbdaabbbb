"""The per-step seeding: the streams ``torch.manual_seed`` would give, per (seed, step, rank)."""

from __future__ import annotations

import random

import numpy as np
import torch

from torchrelay.runtime.rng import seed_all, seed_for


def _draws() -> tuple[torch.Tensor, float, float]:
    return torch.rand(8), float(np.random.rand()), random.random()


def test_seed_all_draws_what_torch_manual_seed_draws() -> None:
    seed_all(7, 3, 1)
    ours = _draws()
    value = seed_for(7, 3, 1)
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)
    reference = _draws()
    assert torch.equal(ours[0], reference[0]) and ours[1:] == reference[1:]


def test_each_rank_and_step_draws_its_own_stream() -> None:
    draws = {}
    for step, rank in ((3, 0), (3, 1), (4, 0)):
        seed_all(7, step, rank)
        draws[step, rank] = torch.rand(8)
    assert not torch.equal(draws[3, 0], draws[3, 1])
    assert not torch.equal(draws[3, 0], draws[4, 0])
    seed_all(7, 3, 1)
    assert torch.equal(torch.rand(8), draws[3, 1])


def test_seeds_of_neighbouring_steps_and_ranks_are_distinct_63_bit_numbers() -> None:
    seeds = {seed_for(7, step, rank) for step in range(-1, 2000) for rank in range(8)}
    assert len(seeds) == 2001 * 8
    assert all(0 <= s < 2**63 for s in seeds)
    # Every bit varies: the low 32 (numpy's seed) as well as the high ones.
    assert all(len({(s >> bit) & 1 for s in seeds}) == 2 for bit in range(63))
