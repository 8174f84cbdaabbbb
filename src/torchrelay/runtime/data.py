"""Deterministic data order: the samples a rank sees at a step are a pure function of
``(seed, epoch, step, rank)``.

That makes the data position part of the step number: a replacement that resumes at step ``s``
reads exactly the samples the dead rank would have read, so every sample is used exactly once
per epoch whatever fails. Batches are produced by torchdata's ``StatefulDataLoader`` driven by
:class:`StepBatchSampler`.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader


def steps_per_epoch(num_samples: int, batch_size: int, world_size: int) -> int:
    """Full global batches per epoch (the tail of an epoch that does not fill one is dropped)."""
    per_step = batch_size * world_size
    if num_samples < per_step:
        raise ValueError(
            f"dataset has {num_samples} samples, fewer than one global batch "
            f"({batch_size} per rank x {world_size} ranks)"
        )
    return num_samples // per_step


def batch_indices(
    num_samples: int, batch_size: int, world_size: int, rank: int, seed: int, step: int
) -> list[int]:
    """Indices of the samples ``rank`` uses at ``step``: disjoint across ranks and steps."""
    per_epoch = steps_per_epoch(num_samples, batch_size, world_size)
    epoch, offset = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_samples)
    start = (offset * world_size + rank) * batch_size
    return order[start : start + batch_size].tolist()


class StepBatchSampler:
    """Yields the batch indices of one rank for steps ``start_step, start_step + 1, ...``."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        world_size: int,
        rank: int,
        seed: int,
        start_step: int,
    ) -> None:
        self.args = (num_samples, batch_size, world_size, rank, seed)
        self.start_step = start_step
        steps_per_epoch(num_samples, batch_size, world_size)

    def __iter__(self) -> Iterator[list[int]]:
        for step in itertools.count(self.start_step):
            yield batch_indices(*self.args, step)


def step_loader(
    dataset: Dataset[Any],
    batch_size: int,
    world_size: int,
    rank: int,
    seed: int,
    start_step: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> Iterator[Any]:
    """An iterator over the batches of ``rank`` from ``start_step`` on."""
    sampler = StepBatchSampler(
        len(dataset),
        batch_size,
        world_size,
        rank,  # type: ignore[arg-type]
        seed,
        start_step,
    )
    with warnings.catch_warnings():
        # torchdata 0.11 calls a torch API that torch itself has deprecated; not ours to fix.
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        loader = StatefulDataLoader(
            dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=0
        )
        return iter(loader)
