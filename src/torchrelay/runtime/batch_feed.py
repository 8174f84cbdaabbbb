"""A rank's batches, kept through a recovery where they can be.

After a recovery a survivor either redoes the step that was in flight or goes on after its last
commit. Its batch iterator is then already where it must be: its last batch is the redone
step's, or its next one is the next step's. Starting a new iterator there instead costs the
survivor its loader: a ``DataLoader`` with workers starts them again, and they fetch again.
:class:`BatchFeed` keeps the iterator and its last batch, and starts a new one only where the
step asked for is neither.

A batch is yielded again only where fetching it drew nothing from this process's RNGs (a loader
with workers: they fetch) -- a batch fetched here drew from the RNGs the step had just seeded,
and the step's dropout masks come after those draws -- and only if the step that used it left
it as it was: the same objects in the same structure, every tensor at the version it had (an
in-place change bumps it). Any other leaf than a tensor or an immutable scalar (a NumPy array,
whose changes leave no trace) also makes the feed start a new iterator, which yields the batch
as it was first made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

IMMUTABLE = (int, float, complex, bool, str, bytes, type(None))


def _fingerprint(batch: Any) -> tuple[Any, list[tuple[Any, int | None]]] | None:
    """What must be unchanged for ``batch`` to be yielded again; ``None`` if a change to it
    could go unseen."""
    leaves, spec = tree_flatten(batch)
    marks: list[tuple[Any, int | None]] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            marks.append((leaf, leaf._version))
        elif isinstance(leaf, IMMUTABLE):
            marks.append((leaf, None))
        else:
            return None
    return spec, marks


def _unchanged(batch: Any, fingerprint: tuple[Any, list[tuple[Any, int | None]]]) -> bool:
    leaves, spec = tree_flatten(batch)
    spec_then, marks = fingerprint
    if spec != spec_then:
        return False
    return all(
        leaf is then and (version is None or leaf._version == version)
        for leaf, (then, version) in zip(leaves, marks, strict=True)
    )


class BatchFeed:
    """One rank's batch of each step. ``start(step)`` returns an iterator over the rank's
    batches from ``step`` on; it is called only where the current iterator cannot serve.
    ``fetched_elsewhere``: its batches are made in other processes (see the module doc)."""

    def __init__(self, start: Callable[[int], Iterator[Any]], fetched_elsewhere: bool) -> None:
        self._start = start
        self._fetched_elsewhere = fetched_elsewhere
        self._batches: Iterator[Any] | None = None
        self._next_step = 0  # the step of the iterator's next batch
        self._last: Any = None
        self._last_step: int | None = None
        self._fingerprint: tuple[Any, list[tuple[Any, int | None]]] | None = None

    def prepare(self, step: int) -> None:
        """Make ``at(step)`` a fetch, starting an iterator if one is needed. Called before the
        step seeds the RNGs: starting one may draw from them (a ``DataLoader`` draws its
        workers' base seed from torch's), which would move the step's draws after it."""
        if not self._reusable(step) and (self._batches is None or step != self._next_step):
            self._batches = self._start(step)
            self._next_step = step

    def at(self, step: int) -> Any:
        """The rank's batch of ``step`` (see the module doc for when it is one yielded before)."""
        if self._reusable(step):
            return self._last
        self.prepare(step)
        # The old batch is not held while the next one is fetched, nor kept if that fails.
        self._last, self._last_step, self._fingerprint = None, None, None
        batch = next(self._batches)  # type: ignore[arg-type]
        self._next_step += 1
        self._last, self._last_step = batch, step
        # Only a batch fetched elsewhere is ever yielded again: none other is fingerprinted.
        self._fingerprint = _fingerprint(batch) if self._fetched_elsewhere else None
        return batch

    def _reusable(self, step: int) -> bool:
        return (
            step == self._last_step
            and self._fingerprint is not None
            and _unchanged(self._last, self._fingerprint)
        )
