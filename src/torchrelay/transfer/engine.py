"""Stream registered state from sources to receivers over a generation's process group.

The schema (tree, tensor specs, chunking) goes through the job's store, sealed with the job
token; tensor bytes go point-to-point over the process group (gloo here, NCCL on GPU), striped
across every source that holds the target step, each chunk checksummed (64-bit xxHash3, at
memory speed) by its sender and verified by the receiver. Each source's checksum list travels
with an HMAC of the job token over (generation, source, chunks, checksums), so bytes altered on
the wire cannot be made to match forged checksums. Receivers load in place into tensors they
already hold (model parameters, existing optimizer state) and allocate only what they lack
(optimizer state of a fresh spare).

Whatever arrives unauthenticated or malformed -- a schema that fails its MAC or names another
generation, a checksum list that fails its MAC, a chunk that fails its checksum -- raises
:class:`TransferError`: a fault of the transfer, which the runtime answers by reporting the
transfer failed, never an exception in the user's script.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torchrelay.control.wire import WireError, seal, unseal
from torchrelay.runtime.devices import comm_device
from torchrelay.transfer.buffers import allocate, fits
from torchrelay.transfer.flatten import (
    Path,
    SchemaError,
    TensorSpec,
    as_bytes,
    flatten,
    unflatten,
)
from torchrelay.transfer.stripes import Chunk, assign_stripes, chunk_size, split_chunks
from torchrelay.transfer.sums import ChunkSums
from torchrelay.transfer.sums import checksum as _checksum

AfterEach = Callable[[int], None]
WaitAll = Callable[[list[dist.Work], AfterEach], None]
# Made with the bytes to receive; called with the bytes of each chunk as it lands.
Progress = Callable[[int], Callable[[int], None]]


def wait_plain(works: list[dist.Work], after_each: AfterEach) -> None:
    """Wait for the works in order, calling ``after_each(i)`` as each one completes.

    Callers that need aborts pass their own waiter with the same contract.
    """
    for index, work in enumerate(works):
        work.wait()
        after_each(index)


def _nothing(_index: int) -> None:
    pass


class TransferError(RuntimeError):
    """State arrived corrupted or does not fit the receiver."""


@dataclass(frozen=True)
class TransferResult:
    """What one rank sent or received."""

    bytes: int
    seconds: float
    state: Any = None
    sidecar: Any = None


# The HMAC-SHA256 of a checksum list, sent after it as four int64 words.
MAC_WORDS = 4


def _checksums_mac(
    token: str, generation: int, source: int, chunks: list[int], sums: list[int]
) -> list[int]:
    """The MAC binding a source's checksums to its chunks, its rank and the generation (so a
    list cannot be replayed from another source or an earlier transfer)."""
    body = {
        "purpose": "torchrelay-checksums",
        "generation": generation,
        "source": source,
        "chunks": chunks,
        "checksums": sums,
    }
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    digest = hmac.new(token.encode(), payload, hashlib.sha256).digest()
    return np.frombuffer(digest, dtype=np.int64).tolist()


def _sealed_checksums(
    token: str,
    generation: int,
    source: int,
    stripe: list[Chunk],
    wire: list[torch.Tensor],
    known: dict[Chunk, int],
) -> list[int]:
    """A source's checksum list followed by its MAC (see :data:`MAC_WORDS`); the checksums in
    ``known`` are taken as they are, the others computed."""
    sums = [known[c] if c in known else _checksum(b) for c, b in zip(stripe, wire, strict=True)]
    return sums + _checksums_mac(token, generation, source, [c.index for c in stripe], sums)


def _open_checksums(
    token: str, generation: int, source: int, stripe: list[Chunk], words: list[int]
) -> list[int]:
    """The checksums of a sealed list from ``source``; :class:`TransferError` if its MAC fails."""
    sums, mac = words[: len(stripe)], words[len(stripe) :]
    expected = _checksums_mac(token, generation, source, [c.index for c in stripe], sums)
    if not hmac.compare_digest(
        np.array(mac, dtype=np.int64).tobytes(), np.array(expected, dtype=np.int64).tobytes()
    ):
        raise TransferError(
            f"the checksum list from source rank {source} failed authentication: altered in "
            "transit or not sent by this job"
        )
    return sums


def _parts(views: list[torch.Tensor], chunk: Chunk) -> list[torch.Tensor]:
    return [views[p.tensor][p.start : p.stop] for p in chunk.pieces]


def _direct(parts: list[torch.Tensor], device: torch.device) -> bool:
    """Whether a chunk can go on the wire as it lies: one piece, where the communicator works
    (NCCL moves GPU memory only; optimizer step counters, for one, live on the CPU)."""
    return len(parts) == 1 and parts[0].device == device


def _packed(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The chunk's bytes in one buffer on ``device`` (a copy unless :func:`_direct`)."""
    if _direct(parts, device):
        return parts[0]
    return torch.cat([p.to(device) for p in parts])


def schema_key(generation: int) -> str:
    """Where the sources publish a generation's state schema in the job's store."""
    return f"torchrelay/g{generation}/schema"


def send_state(
    pg: dist.ProcessGroup,
    store: dist.Store,
    token: str,
    generation: int,
    state: Any,
    rank: int,
    sources: list[int],
    receivers: list[int],
    chunk_bytes: int | None = None,
    wait: WaitAll = wait_plain,
    sidecar: Any = None,
    ready: ChunkSums | None = None,
) -> TransferResult:
    """Send this source's stripe of ``state`` to every receiver; returns bytes sent.

    Every source holds the same state, so they all derive the same ``chunk_bytes`` (unless
    one is given) and the same stripes. ``sidecar`` (small, JSON-able) is what the sources
    may hold differently: only the lowest source's goes out, inside the sealed schema, so a
    receiver never mixes two sources' copies. ``ready`` holds checksums computed while this
    source halted (see :mod:`torchrelay.transfer.sums`).
    """
    start = time.perf_counter()
    tree, tensors, specs = flatten(state)
    views = [as_bytes(t) for t in tensors]
    sizes = [v.numel() for v in views]
    chunk_bytes = chunk_bytes or chunk_size(sum(sizes))
    if rank == min(sources):
        schema = {
            "generation": generation,
            "tree": tree,
            "specs": [s.to_json() for s in specs],
            "chunk_bytes": chunk_bytes,
            "sidecar": sidecar,
        }
        store.set(schema_key(generation), seal(schema, token))
    chunks = split_chunks(sizes, chunk_bytes)
    mine = assign_stripes(chunks, sources)[rank]
    device = comm_device(pg)
    wire = [_packed(_parts(views, chunk), device) for chunk in mine]
    works = [
        pg.send([buffer], receiver, chunk.index)
        for receiver in receivers
        for chunk, buffer in zip(mine, wire, strict=True)
    ]
    # Checksums not computed at the halt are computed while the communicator moves the bytes;
    # they are sent last.
    known = {} if ready is None else ready.take()
    sealed = _sealed_checksums(token, generation, rank, mine, wire, known)
    checksums = torch.tensor(sealed, dtype=torch.int64, device=device)
    works += [pg.send([checksums], receiver, len(chunks) + rank) for receiver in receivers]
    wait(works, _nothing)
    sent = sum(b.numel() for b in wire) * len(receivers)
    return TransferResult(sent, time.perf_counter() - start)


def receive_state(
    pg: dist.ProcessGroup,
    store: dist.Store,
    token: str,
    generation: int,
    own_state: Any,
    sources: list[int],
    wait: WaitAll = wait_plain,
    progress: Progress | None = None,
    prepared: dict[Path, torch.Tensor] | None = None,
    keep_own: bool = False,
) -> TransferResult:
    """Receive the full state from the sources; tensors land in ``own_state``'s where they fit
    (unless ``keep_own``: then ``own_state`` is never written, and is as it was if the transfer
    fails), else in ``prepared``'s (by path; see :class:`torchrelay.transfer.buffers.Prefault`)
    where they fit, else in new tensors.

    ``progress(total)``, if given, is made once the size is known and its result is called with
    each chunk's bytes as the chunk lands (see :class:`torchrelay.progress.ByteProgress`).

    Returns the rebuilt state (``own_state``'s structure replaced by the sources') and the
    lowest source's sidecar. Raises
    :class:`TransferError` for anything unauthenticated, malformed or corrupted.
    """
    start = time.perf_counter()
    tree, specs, chunk_bytes, sidecar = _read_schema(store, token, generation)
    own: dict[Path, torch.Tensor] = {}
    if not keep_own:
        _, own_tensors, own_specs = flatten(own_state)
        own = {spec.path: t for spec, t in zip(own_specs, own_tensors, strict=True)}
    device = comm_device(pg)
    prepared = prepared or {}
    targets = [
        _target(spec, [own.get(spec.path), prepared.get(spec.path)], device) for spec in specs
    ]
    views = [as_bytes(t) for t in targets]
    chunks = split_chunks([v.numel() for v in views], chunk_bytes)
    stripes = assign_stripes(chunks, sources)
    works: list[dist.Work] = []
    # What each work delivers: (chunk, where its bytes belong, where they land), or None for
    # the list of checksums.
    landed: list[tuple[Chunk, list[torch.Tensor], torch.Tensor] | None] = []
    sums: dict[int, torch.Tensor] = {}
    for source, stripe in stripes.items():
        for chunk in stripe:
            parts = _parts(views, chunk)
            wire = (
                parts[0]
                if _direct(parts, device)
                else torch.empty(chunk.nbytes, dtype=torch.uint8, device=device)
            )
            works.append(pg.recv([wire], source, chunk.index))
            landed.append((chunk, parts, wire))
        sums[source] = torch.empty(len(stripe) + MAC_WORDS, dtype=torch.int64, device=device)
        works.append(pg.recv([sums[source]], source, len(chunks) + source))
        landed.append(None)
    actual: dict[int, int] = {}
    landed_bytes = progress(sum(c.nbytes for c in chunks)) if progress else _nothing

    def checksum_landed(index: int) -> None:
        # Runs as each chunk lands, overlapping the checksum with the rest of the transfer.
        if landed[index] is not None:
            chunk, parts, wire = landed[index]  # type: ignore[misc]
            actual[chunk.index] = _checksum(wire)
            if wire is not parts[0]:
                offset = 0
                for part in parts:
                    part.copy_(wire[offset : offset + part.numel()])
                    offset += part.numel()
            landed_bytes(chunk.nbytes)

    wait(works, checksum_landed)
    for source, stripe in stripes.items():
        expected = _open_checksums(token, generation, source, stripe, sums[source].tolist())
        _verify(stripe, actual, expected, source)
    try:
        state = unflatten(tree, targets)
    except (SchemaError, KeyError, TypeError, ValueError) as exc:
        raise TransferError(
            f"the state schema of generation {generation} is malformed: {exc}"
        ) from None
    received = sum(v.numel() for v in views)
    return TransferResult(received, time.perf_counter() - start, state, sidecar)


def _read_schema(
    store: dist.Store, token: str, generation: int
) -> tuple[Any, list[TensorSpec], int, Any]:
    """The sealed schema of ``generation``: (tree, tensor specs, chunk bytes, sidecar).

    Anyone who can reach the store can write the key, so the schema is acted on only if its
    MAC verifies and it names this generation (an old generation's schema replayed here does
    not); otherwise :class:`TransferError`.
    """
    try:
        schema = unseal(store.get(schema_key(generation)), token)
        if schema.get("generation") != generation:
            raise WireError(f"it is for generation {schema.get('generation')!r}")
        specs = [TensorSpec.from_json(s) for s in schema["specs"]]
        chunk_bytes = int(schema["chunk_bytes"])
        if chunk_bytes < 1:
            raise ValueError(f"chunk size {chunk_bytes}")
        return schema["tree"], specs, chunk_bytes, schema.get("sidecar")
    except (WireError, SchemaError, KeyError, TypeError, ValueError) as exc:
        raise TransferError(
            f"the state schema of generation {generation} was rejected: {exc}"
        ) from None


def _target(
    spec: TensorSpec, candidates: list[torch.Tensor | None], device: torch.device
) -> torch.Tensor:
    """The first candidate that can receive ``spec`` in place, else a new tensor."""
    for candidate in candidates:
        if fits(spec, candidate):
            return candidate
    return allocate(spec, device)


def _verify(stripe: list[Chunk], actual: dict[int, int], expected: list[int], source: int) -> None:
    for chunk, checksum in zip(stripe, expected, strict=True):
        if actual[chunk.index] != checksum:
            raise TransferError(
                f"chunk {chunk.index} from source rank {source} failed its checksum "
                f"({actual[chunk.index]:#x} != {checksum:#x}): state corrupted in transit"
            )
