"""Rewindable, re-targetable ``DistributedSampler`` iterators.

A voided step must fetch the same batch again (see :mod:`boundary`), and a clone that takes
over a dead slot must go on with *that* slot's share of the epoch. ``DistributedSampler``'s own
iterator is a ``list_iterator`` over this rank's indices, computed when the epoch starts: it can
neither go back nor change rank. :func:`patch` replaces ``DistributedSampler.__iter__`` with
:class:`SamplerCursor`, a plain iterator over positions of the epoch that reads the sampler's
``rank`` at every step and can be moved back to any position.

Contract: the indices at position ``p`` are exactly the ones the stock iterator yields at ``p``
for the sampler's current rank (the stock code computes them; this module never re-implements
the shuffle). ``BatchSampler`` and a ``DataLoader`` with ``num_workers=0`` pull indices lazily,
so moving a cursor back by the indices of one step makes the loader yield that step's batch
again. A loader with worker processes has fetched ahead; it cannot be rewound (refused by the
hook).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DistributedSampler

# Captured before patch() replaces it: the cursor asks it for each rank's order.
_STOCK_ITER: Callable[[DistributedSampler[Any]], Iterator[int]] = DistributedSampler.__iter__
_live: weakref.WeakSet[SamplerCursor] = weakref.WeakSet()
# Called before a cursor yields an index: where a loader-driven loop iteration starts.
before_next: Callable[[], None] | None = None

Positions = dict["SamplerCursor", int]


class SamplerCursor:
    """One epoch of a ``DistributedSampler``: its ``epoch`` is fixed when the epoch starts (as
    in the stock iterator); its rank is read at each ``next()``."""

    def __init__(self, sampler: DistributedSampler[Any]) -> None:
        self.sampler = sampler
        self.epoch = sampler.epoch
        self.position = 0
        self._orders: dict[int, list[int]] = {}
        _live.add(self)

    def __iter__(self) -> SamplerCursor:
        return self

    def __next__(self) -> int:
        order = self.indices(self.sampler.rank)
        if self.position >= len(order):
            raise StopIteration  # the end of an epoch starts no loop iteration
        if before_next is not None:
            before_next()
        self.position += 1
        return order[self.position - 1]

    def indices(self, rank: int) -> list[int]:
        """``rank``'s indices of this epoch, in order (computed by the stock iterator)."""
        if rank not in self._orders:
            sampler = self.sampler
            saved = sampler.rank, sampler.epoch
            sampler.rank, sampler.epoch = rank, self.epoch
            try:
                self._orders[rank] = list(_STOCK_ITER(sampler))
            finally:
                sampler.rank, sampler.epoch = saved
        return self._orders[rank]


def _cursor_iter(sampler: DistributedSampler[Any]) -> Iterator[int]:
    return SamplerCursor(sampler)


def patch() -> None:
    """Make every ``DistributedSampler`` iterate through a :class:`SamplerCursor`; idempotent."""
    DistributedSampler.__iter__ = _cursor_iter  # type: ignore[assignment,method-assign]


def positions() -> Positions:
    """Where every live cursor stands now (a step boundary's snapshot)."""
    return {cursor: cursor.position for cursor in list(_live)}


def rewind(snapshot: Positions) -> None:
    """Move every cursor back to ``snapshot``; a cursor started since (a new epoch began in the
    voided step) goes back to its start."""
    for cursor in list(_live):
        cursor.position = snapshot.get(cursor, 0)


def retarget(rank: int) -> None:
    """Give every live ``DistributedSampler`` the rank ``rank`` (a clone taking over a slot):
    the rest of the epoch in flight, and every later epoch, is that slot's share."""
    # type(), not isinstance(): a proxy object's __class__ property must not run here.
    for obj in gc.get_objects():
        if issubclass(type(obj), DistributedSampler):
            obj.rank = rank
