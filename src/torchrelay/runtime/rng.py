"""Per-(seed, step, rank) random streams.

Each step re-seeds torch, numpy and ``random`` from ``(seed, step, rank)``, so a replacement
that takes over a rank draws the very dropout masks (and any other random numbers) the dead
rank would have drawn.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import torch

SETUP_STEP = -1


_MASK = 2**64 - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's step and finaliser: a bijection of 64-bit words whose outputs for
    neighbouring inputs are unrelated."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def seed_for(*words: int) -> int:
    """A 63-bit seed that mixes ``words`` (here seed, step, rank), each folded in through
    SplitMix64, so neighbouring steps or ranks get unrelated seeds.

    Not numpy's ``SeedSequence``, which mixes as well but cost 35 µs of every step once the
    step's tensors had evicted it from the caches (this: 12 µs; measured in
    ``bench.steady_ab``'s processes).
    """
    mixed = 0
    for word in words:
        mixed = _splitmix64(mixed ^ (word & _MASK))
    return mixed >> 1


@functools.cache
def _has_cuda() -> bool:
    """Asked once: ``torch.cuda.is_available()`` cost 20 µs a step (same measure)."""
    return torch.cuda.is_available()


def seed_all(*words: int) -> None:
    """Seed every stream a step (``seed, step, rank``) or a batch's fetch (its key) draws
    from, from :func:`seed_for` of ``words``: torch's CPU and CUDA generators (the devices a
    relay computes on), numpy's and ``random``'s.

    Not ``torch.manual_seed``: it also queues lazy seeds for XPU and for CUDA when CUDA is not
    initialised, each capturing a traceback (~0.1 ms a call, paid at every step here).
    """
    value = seed_for(*words)
    torch.default_generator.manual_seed(value)
    if _has_cuda():  # lazily, if CUDA is not initialised yet
        torch.cuda.manual_seed_all(value)
    random.seed(value)
    np.random.seed(value % 2**32)
