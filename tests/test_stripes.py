"""Striping state over sources: every byte sent exactly once, balanced, deterministic."""

import pytest

from torchrelay.transfer.stripes import assign_stripes, split_chunks


def test_chunks_cover_every_byte_once():
    sizes = [10, 0, 25, 7]
    chunks = split_chunks(sizes, chunk_bytes=8)
    for tensor, size in enumerate(sizes):
        covered = sorted((c.start, c.stop) for c in chunks if c.tensor == tensor)
        position = 0
        for start, stop in covered:
            assert start == position and stop - start <= 8
            position = stop
        assert position == size
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_stripes_balance_bytes_and_partition_chunks():
    chunks = split_chunks([100, 100, 100, 40, 40], chunk_bytes=50)
    stripes = assign_stripes(chunks, [0, 2, 5])
    sent = sorted(c.index for stripe in stripes.values() for c in stripe)
    assert sent == [c.index for c in chunks]
    loads = [sum(c.nbytes for c in stripe) for stripe in stripes.values()]
    assert max(loads) - min(loads) <= 50


def test_stripes_are_deterministic():
    chunks = split_chunks([30, 17, 99], chunk_bytes=16)
    assert assign_stripes(chunks, [1, 3]) == assign_stripes(list(chunks), [1, 3])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        split_chunks([1], chunk_bytes=0)
    with pytest.raises(ValueError):
        assign_stripes([], [])
