"""Per-chunk checksums, and a source's checksums computed while it halts.

A chunk's checksum is the 64-bit xxHash3 of its bytes (at memory speed), cut to 63 bits so that
it fits the int64 tensor it travels in. A survivor's state does not change from the moment it
halts until it has sent it (its training thread waits for the plan, then sends), and the chunks
a transfer cuts depend on the state alone (:func:`torchrelay.transfer.stripes.chunk_size`), not
on the plan. So a survivor hashes every chunk of its state in a daemon thread as soon as it
halts -- time it would spend idle while the failure is detected, planned for and the
communicator re-formed -- and its transfer takes the values that are ready
(:meth:`ChunkSums.take`) and hashes the rest itself. Without this, each source hashes its stripe
while the wire moves it, and on a machine with few cores the two compete for them.

Failure behaviour: a value is reused only for a chunk identical (index and byte ranges) to one
the transfer cuts, so a state that changed shape is hashed afresh; an error in the thread
leaves the values it had not reached to the transfer (a state that cannot be flattened: all
of them, for the transfer to report).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import xxhash

from torchrelay.transfer.flatten import SchemaError, as_bytes, flatten
from torchrelay.transfer.stripes import Chunk, chunk_size, split_chunks

_MASK = 2**63 - 1


def checksum(piece: torch.Tensor) -> int:
    """The checksum of one flat byte tensor (``.cpu()`` also orders the read after a GPU
    communicator's writes)."""
    return xxhash.xxh3_64_intdigest(piece.cpu().numpy().data) & _MASK


def checksum_parts(parts: list[torch.Tensor]) -> int:
    """The checksum of the concatenation of ``parts``, without concatenating them (xxHash3's
    streaming digest equals its one-shot digest)."""
    digest = xxhash.xxh3_64()
    for part in parts:
        digest.update(part.cpu().numpy().data)
    return digest.intdigest() & _MASK


class ChunkSums:
    """The checksums of every chunk of ``state``, computed in a daemon thread from creation."""

    def __init__(self, state: Any) -> None:
        self._values: dict[Chunk, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(state,), name="torchrelay-checksums", daemon=True
        )
        self._thread.start()

    def take(self) -> dict[Chunk, int]:
        """Stop hashing (after the chunk in hand); the values computed so far, by chunk."""
        self._stop.set()
        self._thread.join()
        return self._values

    def finished(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for every chunk to be hashed; whether it is."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self, state: Any) -> None:
        try:
            views = [as_bytes(t) for t in flatten(state)[1]]
        except SchemaError:
            return  # a state no transfer can send: the transfer reports it
        sizes = [v.numel() for v in views]
        for chunk in split_chunks(sizes, chunk_size(sum(sizes))):
            if self._stop.is_set():
                return
            parts = [views[p.tensor][p.start : p.stop] for p in chunk.pieces]
            self._values[chunk] = checksum_parts(parts)
