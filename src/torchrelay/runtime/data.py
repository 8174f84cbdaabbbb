"""Deterministic data order: the samples a rank sees at a step are a pure function of
``(seed, epoch, step, rank)``.

That makes the data position part of the step number: a replacement that resumes at step ``s``
reads exactly the samples the dead rank would have read, so every sample is used exactly once
per epoch whatever fails. Batches are produced by torchdata's ``StatefulDataLoader`` driven by
:class:`StepBatchSampler`.

A script that brings its own ``DataLoader`` over a ``DistributedSampler`` keeps it: its order is
a function of ``(sampler seed, epoch, rank)`` too, so :func:`sampler_loader` maps a step onto
``(epoch, batch within the epoch)``, sets the sampler's epoch and rank (a spare built it before
it had a slot) and starts the epoch at that batch without loading the ones before it.

A loader with workers (``num_workers > 0``) would still draw its random augmentations from
each worker's RNG, which is seeded once when the worker starts and advanced by every batch that
worker fetched before: restarted mid-epoch, batch ``b`` goes to another worker, in another
state, and gets other augmentations than in the run without the failure. So each batch is
fetched with torch's, ``random``'s and NumPy's global RNGs seeded from ``(sampler seed, epoch,
rank, batch)`` (:class:`SeededFetch`): its augmentations are the same whichever worker fetches
it, and whenever. An augmentation that keeps an RNG of its own (one made in ``worker_init_fn``)
is not reached. Without workers the batch is fetched in the training process, right after the
step's own seeding, which already makes it a function of the step.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from torchrelay.runtime.rng import seed_all


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


def loader_steps_per_epoch(loader: DataLoader[Any], world_size: int) -> int:
    """Steps per epoch of a script's ``DataLoader`` over a ``DistributedSampler``; raises
    ``ValueError`` saying what to change for any other loader."""
    sampler = loader.sampler
    if not isinstance(sampler, DistributedSampler) or loader.batch_size is None:
        raise ValueError(
            "relay.steps(loader) needs a DataLoader built with batch_size=... and "
            "sampler=DistributedSampler(dataset); otherwise pass the dataset and batch_size"
        )
    if sampler.num_replicas != world_size:
        raise ValueError(
            f"the loader's DistributedSampler has num_replicas={sampler.num_replicas}, the job "
            f"{world_size} ranks: build it with DistributedSampler(dataset)"
        )
    if len(loader) == 0:
        raise ValueError("the loader yields no batch per epoch")
    return len(loader)


def epoch_length(dataset: Any, batch_size: int | None, world_size: int) -> int | None:
    """Steps per epoch of what ``relay.steps`` was given (``None``: no dataset); raises
    ``ValueError`` saying what to change for a loader or a call it cannot drive."""
    if dataset is None:
        return None
    if isinstance(dataset, DataLoader):
        return loader_steps_per_epoch(dataset, world_size)
    if batch_size is None:
        raise ValueError("steps(dataset, ...) needs batch_size")
    return steps_per_epoch(len(dataset), batch_size, world_size)


def sampler_loader(
    loader: DataLoader[Any], rank: int, start_step: int, own: bool = True
) -> Iterator[Any]:
    """This rank's batches of ``loader`` from ``start_step`` on, epoch after epoch. ``own``:
    the script's sampler is set to this rank; else (a rank this process hosts) a copy is."""
    sampler = loader.sampler if own else copy.copy(loader.sampler)
    assert isinstance(sampler, DistributedSampler) and loader.batch_size is not None
    per_epoch = len(loader)
    sampler.rank = rank
    step = start_step
    while True:
        epoch, offset = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        batches = list(BatchSampler(sampler, loader.batch_size, loader.drop_last))[offset:]
        dataset: Any = loader.dataset
        if loader.num_workers > 0:
            dataset = SeededFetch(loader.dataset)
            keys = [(sampler.seed, epoch, rank, offset + i) for i in range(len(batches))]
            batches = [[(key, i) for i in b] for key, b in zip(keys, batches, strict=True)]
        yield from DataLoader(
            dataset,
            batch_sampler=batches,
            # A DataLoader draws its workers' base seed when it starts: from the global RNG
            # (re-seeded every step: the dropout masks would depend on where a recovery
            # restarted the epoch) unless it has a generator of its own.
            generator=torch.Generator().manual_seed(epoch),
            collate_fn=loader.collate_fn,
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn,
            timeout=loader.timeout,
        )
        step += len(batches)


class SeededFetch(Dataset[Any]):
    """A map-style dataset whose batches are fetched with the global RNGs seeded from the
    batch's key (see the module doc). Its batch sampler yields, per batch, ``(key, index)``
    pairs with one key: ``(sampler seed, epoch, rank, batch within the epoch)``."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, keyed: tuple[tuple[int, ...], int]) -> Any:
        return self.__getitems__([keyed])[0]

    def __getitems__(self, keyed: list[tuple[tuple[int, ...], int]]) -> list[Any]:
        seed_all(*keyed[0][0])
        indices = [index for _, index in keyed]
        fetch = getattr(self.dataset, "__getitems__", None)
        return list(fetch(indices)) if fetch else [self.dataset[i] for i in indices]
