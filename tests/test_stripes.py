"""Striping state over sources: every byte sent exactly once, balanced, deterministic."""

import pytest

from torchrelay.transfer.stripes import assign_stripes, chunk_size, split_chunks


def test_chunks_cover_every_byte_once():
    sizes = [10, 0, 25, 7, 3]
    chunks = split_chunks(sizes, chunk_bytes=8, pack_below=8)
    covered = sorted(
        (p.tensor, b) for c in chunks for p in c.pieces for b in range(p.start, p.stop)
    )
    assert covered == [(t, b) for t, size in enumerate(sizes) for b in range(size)]
    assert all(c.nbytes <= 8 for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_small_tensors_share_chunks_and_large_ones_go_alone_and_split():
    chunks = split_chunks([3, 2, 20, 1, 4], chunk_bytes=8, pack_below=5)
    assert [[(p.tensor, p.start, p.stop) for p in c.pieces] for c in chunks] == [
        [(2, 0, 8)],
        [(2, 8, 16)],
        [(2, 16, 20)],
        [(0, 0, 3), (1, 0, 2), (3, 0, 1)],
        [(4, 0, 4)],
    ]


def test_chunk_size_keeps_several_sources_busy_but_bounded():
    assert chunk_size(1 << 30) == 4 * 1024 * 1024
    assert chunk_size(16 * 1024 * 1024) == 1024 * 1024
    assert chunk_size(1000) == 64 * 1024


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
