"""Per-(seed, step, rank) random streams.

Each step re-seeds torch, numpy and ``random`` from ``(seed, step, rank)``, so a replacement
that takes over a rank draws the very dropout masks (and any other random numbers) the dead
rank would have drawn.
"""

from __future__ import annotations

import random

import numpy as np
import torch

SETUP_STEP = -1


def seed_for(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed mixing the three numbers (SeedSequence avoids correlated streams)."""
    words = np.random.SeedSequence([seed, step + 1, rank]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def seed_all(seed: int, step: int, rank: int) -> None:
    """Seed every stream a step draws from: torch's CPU and CUDA generators (the devices a
    relay computes on), numpy's and ``random``'s.

    Not ``torch.manual_seed``: it also queues lazy seeds for XPU and for CUDA when CUDA is not
    initialised, each capturing a traceback (~0.1 ms a call, paid at every step here).
    """
    value = seed_for(seed, step, rank)
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_available():  # lazily, if CUDA is not initialised yet
        torch.cuda.manual_seed_all(value)
    random.seed(value)
    np.random.seed(value % 2**32)
