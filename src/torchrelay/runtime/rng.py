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
    value = seed_for(seed, step, rank)
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value % 2**32)
