"""Which source sends which bytes: cut state into chunks and stripe them over the sources.

Pure functions. A large tensor is cut into chunks of at most ``chunk_bytes`` that go on the
wire as they lie in memory (no copy), so it is still spread over every source. Small tensors
(under ``pack_below`` bytes: biases, norms, step counters) are packed together into shared
chunks, so a model's hundreds of them travel in a few messages rather than one each; packing
copies, which is cheap only for small tensors. Chunks go to sources by greedy balancing on
bytes, so every source sends about the same amount.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
MIN_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class Piece:
    """Bytes ``[start, stop)`` of tensor ``tensor``."""

    tensor: int
    start: int
    stop: int


@dataclass(frozen=True)
class Chunk:
    """One message on the wire, tagged ``index``: a piece of one large tensor, or several
    small tensors packed together."""

    index: int
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.stop - p.start for p in self.pieces)


def chunk_size(total_bytes: int, most: int = DEFAULT_CHUNK_BYTES) -> int:
    """At most ``most``, yet small enough that a state is cut into about 16 chunks or more, so
    that up to 4 sources get a few each. It depends on the state's size alone, so a survivor
    can hash its chunks before it knows the plan (see :mod:`torchrelay.transfer.sums`)."""
    return max(MIN_CHUNK_BYTES, min(most, -(-total_bytes // 16)))


def split_chunks(
    sizes: list[int], chunk_bytes: int = DEFAULT_CHUNK_BYTES, pack_below: int = MIN_CHUNK_BYTES
) -> list[Chunk]:
    """Cut tensors of ``sizes`` bytes into chunks: each tensor of ``pack_below`` bytes or more
    into its own chunks of at most ``chunk_bytes``, smaller ones packed together up to
    ``chunk_bytes`` a chunk. Empty tensors take no bytes."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    chunks: list[Chunk] = []
    packed: list[Piece] = []

    def emit(pieces: list[Piece]) -> None:
        chunks.append(Chunk(len(chunks), tuple(pieces)))

    for tensor, size in enumerate(sizes):
        if size >= min(pack_below, chunk_bytes):
            for start in range(0, size, chunk_bytes):
                emit([Piece(tensor, start, min(size, start + chunk_bytes))])
        elif size > 0:
            if sum(p.stop for p in packed) + size > chunk_bytes:
                emit(packed)
                packed = []
            packed.append(Piece(tensor, 0, size))
    if packed:
        emit(packed)
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
