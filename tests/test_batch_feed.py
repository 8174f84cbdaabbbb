"""A rank's batches through a recovery (runtime/batch_feed.py): the iterator is kept where it
can serve the step asked for, and a batch is yielded again only if nothing about it changed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from torchrelay.runtime.batch_feed import BatchFeed


class Loader:
    """Counts the iterators started; batch ``s`` is ``{"x": [s, s], "step": s}``."""

    def __init__(self, extra=None) -> None:
        self.starts: list[int] = []
        self.extra = extra

    def __call__(self, start: int):
        self.starts.append(start)
        return self._batches(start)

    def _batches(self, start: int):
        for step in itertools.count(start):
            batch = {"x": torch.full((2,), float(step)), "step": step}
            if self.extra is not None:
                batch["extra"] = self.extra
            yield batch


def test_a_survivor_that_goes_on_after_its_last_commit_keeps_its_iterator():
    loader = Loader()
    feed = BatchFeed(loader, fetched_elsewhere=True)
    assert [feed.at(s)["step"] for s in range(4)] == [0, 1, 2, 3]
    assert feed.at(4)["step"] == 4  # a recovery between steps 3 and 4
    assert loader.starts == [0]


def test_the_step_in_flight_is_redone_with_the_very_batch_it_had():
    loader = Loader()
    feed = BatchFeed(loader, fetched_elsewhere=True)
    feed.at(0)
    doomed = feed.at(1)
    assert feed.at(1) is doomed  # redone after the recovery
    assert feed.at(2)["step"] == 2
    assert loader.starts == [0]


def test_a_batch_fetched_in_this_process_is_fetched_again():
    """Fetching it drew from the RNGs the step had seeded: the redo must draw the same."""
    loader = Loader()
    feed = BatchFeed(loader, fetched_elsewhere=False)
    doomed = feed.at(0)
    again = feed.at(0)
    assert again is not doomed and torch.equal(again["x"], doomed["x"])
    assert feed.at(1)["step"] == 1
    assert loader.starts == [0, 0]


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b["x"].add_(1),  # in place
        lambda b: b.__setitem__("x", b["x"] * 2),  # replaced
        lambda b: b.__setitem__("mask", torch.ones(2)),  # structure
    ],
)
def test_a_batch_the_step_changed_is_made_again(change):
    loader = Loader()
    feed = BatchFeed(loader, fetched_elsewhere=True)
    doomed = feed.at(0)
    change(doomed)
    again = feed.at(0)
    assert again is not doomed and torch.equal(again["x"], torch.zeros(2))
    assert set(again) == {"x", "step"}
    assert loader.starts == [0, 0]


def test_a_leaf_whose_changes_leave_no_trace_is_never_reused():
    loader = Loader(extra=np.zeros(2))
    feed = BatchFeed(loader, fetched_elsewhere=True)
    doomed = feed.at(0)
    assert feed.at(0) is not doomed
    assert loader.starts == [0, 0]


def test_any_other_step_starts_an_iterator_there():
    loader = Loader()
    feed = BatchFeed(loader, fetched_elsewhere=True)
    feed.at(0), feed.at(1), feed.at(2)
    assert feed.at(1)["step"] == 1  # back by one past the last batch
    assert feed.at(5)["step"] == 5  # ahead
    assert loader.starts == [0, 1, 5]


def test_an_iterator_is_started_before_the_step_seeds_its_rngs():
    """A DataLoader's iterator draws its workers' base seed from torch's RNG when it starts:
    prepare() starts it, so that the step's own draws after its seeding stay the same."""
    loader = Loader()

    def start(step):
        torch.randint(1 << 30, ())  # as DataLoader.__iter__ does
        return loader(step)

    feed = BatchFeed(start, fetched_elsewhere=False)
    for step in (0, 0, 1):  # the first, a redo (fetched again), the next
        feed.prepare(step)
        torch.manual_seed(step)
        assert feed.at(step)["step"] == step
        drawn = torch.rand(1)
        torch.manual_seed(step)
        assert torch.equal(drawn, torch.rand(1))
    assert loader.starts == [0, 0]
