"""Which source sends which bytes: split state into chunks and stripe them over the sources.

Pure functions. Tensors are split into chunks of at most ``chunk_bytes`` so that one large
tensor is still spread over every source; chunks go to sources by greedy balancing on bytes,
so every source sends about the same amount.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    """Bytes ``[start, stop)`` of tensor ``tensor``; ``index`` is its tag on the wire."""

    index: int
    tensor: int
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


def split_chunks(sizes: list[int], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[Chunk]:
    """Cut tensors of ``sizes`` bytes into chunks of at most ``chunk_bytes`` (skips empty ones)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    chunks: list[Chunk] = []
    for tensor, size in enumerate(sizes):
        for start in range(0, size, chunk_bytes):
            chunks.append(Chunk(len(chunks), tensor, start, min(size, start + chunk_bytes)))
    return chunks


def assign_stripes(chunks: list[Chunk], sources: list[int]) -> dict[int, list[Chunk]]:
    """Map each source to the chunks it sends, balancing bytes (largest chunks first).

    Deterministic: every rank computes the same assignment from the same inputs.
    """
    if not sources:
        raise ValueError("at least one source is needed")
    load = {source: 0 for source in sources}
    stripes: dict[int, list[Chunk]] = {source: [] for source in sources}
    for chunk in sorted(chunks, key=lambda c: (-c.nbytes, c.index)):
        source = min(sources, key=lambda s: (load[s], s))
        stripes[source].append(chunk)
        load[source] += chunk.nbytes
    for stripe in stripes.values():
        stripe.sort(key=lambda c: c.index)
    return stripes
