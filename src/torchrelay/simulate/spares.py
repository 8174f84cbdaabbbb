"""Spare-pool blocking: the chance a failure finds too few free spares.

Failures that live recovery will handle arrive as Poisson streams, one per failure class;
class i takes ``gpus_i`` spares at once and returns them together after the repair time.
That is a multi-rate loss system, whose occupancy the Kaufman-Roberts recursion gives
exactly, for any repair-time distribution (insensitivity):

    j * q(j) = sum_i a_i * g_i * q(j - g_i),   a_i = arrival rate_i * repair time

and class i is blocked when more than ``pool - g_i`` spares are busy.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchrelay.simulate.errors import ScenarioError

# (offered load in Erlangs = arrivals per hour * repair hours, GPUs taken per arrival)
Load = tuple[float, int]

_RESCALE = 1e200  # q(j) grows like a**j / j! before it falls; rescale long before overflow


def _grow(loads: Sequence[Load], q: list[float]) -> None:
    """Extend the unnormalised occupancy ``q`` in place to a pool one spare larger."""
    j = len(q)
    q.append(sum(a * g * q[j - g] for a, g in loads if g <= j) / j)
    if q[-1] > _RESCALE:
        q[:] = [x / _RESCALE for x in q]


def _class_blocking(loads: Sequence[Load], q: Sequence[float]) -> list[float]:
    total = sum(q)
    pool = len(q) - 1
    return [1.0 if g > pool else sum(q[pool - g + 1 :]) / total for _, g in loads]


def _overall(loads: Sequence[Load], per_class: Sequence[float]) -> float:
    offered = sum(a for a, _ in loads)
    return (
        sum(a * b for (a, _), b in zip(loads, per_class, strict=True)) / offered if offered else 0.0
    )


def blocking(loads: Sequence[Load], pool: int) -> list[float]:
    """Per class, the long-run share of its arrivals that find fewer than ``g_i`` free spares
    in a pool of ``pool`` (1.0 for a class larger than the pool)."""
    q = [1.0]
    while len(q) <= pool:
        _grow(loads, q)
    return _class_blocking(loads, q)


def smallest_pool(loads: Sequence[Load], target: float, limit: int) -> int:
    """The smallest pool, at most ``limit``, whose arrival-weighted blocking is <= ``target``.

    Raises ``ScenarioError`` when even ``limit`` spares cannot reach the target."""
    q = [1.0]
    while _overall(loads, _class_blocking(loads, q)) > target:
        if len(q) > limit:
            raise ScenarioError(
                f"spares.target_blocking: {target} is not reachable with up to {limit} spares "
                "(as many as the job has GPUs); set spares.count explicitly"
            )
        _grow(loads, q)
    return len(q) - 1
