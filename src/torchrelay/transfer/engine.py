"""Stream registered state from sources to receivers over a generation's process group.

The schema (tree, tensor specs, chunking) goes through the job's store, sealed with the job
token; tensor bytes go point-to-point over the process group (gloo here, NCCL on GPU), striped
across every source that holds the target step, each chunk checksummed (CRC32) by its sender and
verified by the receiver. Receivers load in place into tensors they already hold (model
parameters, existing optimizer state) and allocate only what they lack (optimizer state of a
fresh spare).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from torchrelay.control.wire import seal, unseal
from torchrelay.runtime.devices import comm_device
from torchrelay.transfer.flatten import TensorSpec, as_bytes, flatten, unflatten
from torchrelay.transfer.stripes import DEFAULT_CHUNK_BYTES, Chunk, assign_stripes, split_chunks

AfterEach = Callable[[int], None]
WaitAll = Callable[[list[dist.Work], AfterEach], None]


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


def _crc(piece: torch.Tensor) -> int:
    # .cpu() also orders the read after the communicator's writes on a GPU.
    return zlib.crc32(piece.cpu().numpy().data)


def _on(device: torch.device, piece: torch.Tensor) -> torch.Tensor:
    """``piece`` itself if the communicator can move it, else a copy staged on ``device``
    (NCCL moves GPU memory only; optimizer step counters, for one, live on the CPU)."""
    return piece if piece.device == device else piece.to(device)


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
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    wait: WaitAll = wait_plain,
) -> TransferResult:
    """Send this source's stripe of ``state`` to every receiver; returns bytes sent."""
    start = time.perf_counter()
    tree, tensors, specs = flatten(state)
    if rank == min(sources):
        schema = {"tree": tree, "specs": [s.to_json() for s in specs], "chunk_bytes": chunk_bytes}
        store.set(schema_key(generation), seal(schema, token))
    views = [as_bytes(t) for t in tensors]
    chunks = split_chunks([v.numel() for v in views], chunk_bytes)
    mine = assign_stripes(chunks, sources)[rank]
    device = comm_device(pg)
    pieces = [views[c.tensor][c.start : c.stop] for c in mine]
    wire = [_on(device, p) for p in pieces]
    works = [
        pg.send([piece], receiver, chunk.index)
        for receiver in receivers
        for chunk, piece in zip(mine, wire, strict=True)
    ]
    # Checksums are computed while the communicator moves the bytes, and sent last.
    checksums = torch.tensor([_crc(p) for p in pieces], dtype=torch.int64, device=device)
    works += [pg.send([checksums], receiver, len(chunks) + rank) for receiver in receivers]
    wait(works, _nothing)
    sent = sum(p.numel() for p in pieces) * len(receivers)
    return TransferResult(sent, time.perf_counter() - start)


def receive_state(
    pg: dist.ProcessGroup,
    store: dist.Store,
    token: str,
    generation: int,
    own_state: Any,
    sources: list[int],
    wait: WaitAll = wait_plain,
) -> TransferResult:
    """Receive the full state from the sources; tensors land in ``own_state``'s where they fit.

    Returns the rebuilt state (``own_state``'s structure replaced by the sources').
    """
    start = time.perf_counter()
    schema = unseal(store.get(schema_key(generation)), token)
    specs = [TensorSpec.from_json(s) for s in schema["specs"]]
    _, own_tensors, own_specs = flatten(own_state)
    own = {spec.path: t for spec, t in zip(own_specs, own_tensors, strict=True)}
    device = comm_device(pg)
    targets = [_target_for(spec, own.get(spec.path), device) for spec in specs]
    views = [as_bytes(t) for t in targets]
    chunks = split_chunks([v.numel() for v in views], int(schema["chunk_bytes"]))
    stripes = assign_stripes(chunks, sources)
    works: list[dist.Work] = []
    # What each work delivers: (chunk, where it belongs, where it lands), or None for the
    # list of checksums.
    landed: list[tuple[Chunk, torch.Tensor, torch.Tensor] | None] = []
    sums: dict[int, torch.Tensor] = {}
    for source, stripe in stripes.items():
        for chunk in stripe:
            piece = views[chunk.tensor][chunk.start : chunk.stop]
            wire = piece if piece.device == device else torch.empty_like(piece, device=device)
            works.append(pg.recv([wire], source, chunk.index))
            landed.append((chunk, piece, wire))
        sums[source] = torch.empty(len(stripe), dtype=torch.int64, device=device)
        works.append(pg.recv([sums[source]], source, len(chunks) + source))
        landed.append(None)
    actual: dict[int, int] = {}

    def checksum_landed(index: int) -> None:
        # Runs as each chunk lands, overlapping the checksum with the rest of the transfer.
        if landed[index] is not None:
            chunk, piece, wire = landed[index]  # type: ignore[misc]
            if wire is not piece:
                piece.copy_(wire)
            actual[chunk.index] = _crc(piece)

    wait(works, checksum_landed)
    for source, stripe in stripes.items():
        _verify(stripe, actual, sums[source].tolist(), source)
    state = unflatten(schema["tree"], targets)
    received = sum(v.numel() for v in views)
    return TransferResult(received, time.perf_counter() - start, state)


def _target_for(
    spec: TensorSpec, existing: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """Receive in place into ``existing`` if it fits; else allocate where the sender keeps
    the tensor (on this rank's GPU for a GPU tensor, when it has one)."""
    if (
        existing is not None
        and existing.dtype == spec.dtype
        and tuple(existing.shape) == spec.shape
        and existing.is_contiguous()
    ):
        return existing
    where = device if spec.device == "cuda" and device.type == "cuda" else torch.device("cpu")
    return torch.empty(spec.shape, dtype=spec.dtype, device=where)


def _verify(stripe: list[Chunk], actual: dict[int, int], expected: list[int], source: int) -> None:
    for chunk, checksum in zip(stripe, expected, strict=True):
        if actual[chunk.index] != checksum:
            raise TransferError(
                f"chunk {chunk.index} from source rank {source} failed its checksum "
                f"({actual[chunk.index]:#x} != {checksum:#x}): state corrupted in transit"
            )
