"""Job mean time to failure (MTTF) as a function of cluster size, from calibration points.

Published MTTFs do not scale as 1/N (Kokolis et al.: 7.9 h at 1,024 GPUs but 1.8 h, not
0.5 h, at 16,384), so between calibration points the MTTF is interpolated linearly in
log(MTTF) versus log(GPUs). Outside the calibrated range nothing is known about the trend,
so the per-GPU failure rate of the nearest point is held constant (MTTF proportional to 1/N),
the textbook independent-failures assumption.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def mttf_at(points: Sequence[tuple[int, float]], gpus: int) -> float:
    """Job MTTF in hours at ``gpus``; exact at every calibration point, positive everywhere."""
    ordered = sorted(points)
    low_gpus, low_mttf = ordered[0]
    if gpus <= low_gpus:
        return low_mttf * low_gpus / gpus
    high_gpus, high_mttf = ordered[-1]
    if gpus >= high_gpus:
        return high_mttf * high_gpus / gpus
    for (n0, m0), (n1, m1) in itertools.pairwise(ordered):
        if n0 <= gpus <= n1:
            fraction = math.log(gpus / n0) / math.log(n1 / n0)
            return math.exp(math.log(m0) + fraction * (math.log(m1) - math.log(m0)))
    raise AssertionError("unreachable: gpus lies inside the calibrated range")


def method(points: Sequence[tuple[int, float]], gpus: int) -> str:
    """One line saying how ``mttf_at`` obtained the MTTF at ``gpus``, for reports."""
    sizes = sorted(n for n, _ in points)
    if gpus in sizes:
        return f"calibration point at {gpus:,} GPUs"
    if sizes[0] < gpus < sizes[-1]:
        below = max(n for n in sizes if n < gpus)
        above = min(n for n in sizes if n > gpus)
        return f"log-log interpolation between {below:,} and {above:,} GPUs"
    nearest = sizes[0] if gpus < sizes[0] else sizes[-1]
    return f"per-GPU rate of the {nearest:,}-GPU point held (MTTF ~ 1/N)"
