"""Where received tensors land: in place, in buffers a spare faulted in while it waited, or new.

Receiving into freshly allocated memory is two to three times slower than receiving into
memory that is already mapped (``python -m bench.xfer``; docs/benchmarks.md, issue 15): the
kernel maps each 4 KiB page at its first write, inside the receive. A fresh spare holds its
model's parameters but no optimizer state -- two thirds of an AdamW job's state -- so without
help it pays that cost on the recovery's critical path.

So the state's *layout* (every tensor's path, dtype, shape and device; no values) is published
once per generation by its rank 0, sealed with the job token, under :data:`LAYOUT_KEY`; and a
waiting spare runs a :class:`Prefault` thread that reads it and allocates, and writes every page
of, each tensor its own state lacks. The transfer takes those buffers (:meth:`Prefault.take`)
instead of allocating.

A survivor one step behind its peers (a laggard) receives too, and a transfer into its own
tensors that fails half-way leaves it holding no valid state at all: if the transfer failed
because its last source died, the job has no replica left although the laggard's own step was
one step from the target. So a receiver with valid state receives into new memory when a copy
of the state fits (:func:`room_for_a_copy`: at most half the memory free where it would land)
and loads it only once every chunk is verified; otherwise it receives in place, as before.

Failure behaviour: nothing here can make a transfer fail or change what it delivers. A layout
that is missing, fails authentication or is malformed is ignored (the transfer allocates as
before); a buffer the transfer's own sealed schema does not match is not used. A process that
exits while the thread fills a buffer waits for that one buffer first.
"""

from __future__ import annotations

import atexit
import datetime
import threading
from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Any

import torch
import torch.distributed as dist

from torchrelay.control.wire import WireError, seal, unseal
from torchrelay.transfer.flatten import Path, SchemaError, TensorSpec, as_bytes, flatten

LAYOUT_KEY = "torchrelay/layout"
# How long one wait for the layout blocks: long, because take() never waits for it, and a
# wait that times out makes c10d log a warning.
_WAIT = datetime.timedelta(hours=1)


def fits(spec: TensorSpec, tensor: torch.Tensor | None) -> bool:
    """Whether ``tensor`` can receive ``spec``'s bytes in place."""
    return (
        tensor is not None
        and tensor.dtype == spec.dtype
        and tuple(tensor.shape) == spec.shape
        and tensor.is_contiguous()
    )


def landing(spec: TensorSpec, device: torch.device) -> torch.device:
    """Where a new tensor for ``spec`` goes: where the sender keeps it (on this rank's GPU for a
    GPU tensor, when it has one)."""
    return device if spec.device == "cuda" and device.type == "cuda" else torch.device("cpu")


def allocate(spec: TensorSpec, device: torch.device) -> torch.Tensor:
    """A new tensor for ``spec``, at :func:`landing`."""
    return torch.empty(spec.shape, dtype=spec.dtype, device=landing(spec, device))


def free_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can take on ``device`` (None if unknown): for a GPU, the driver's
    free memory plus what torch's caching allocator holds unused; for the host, the kernel's
    ``MemAvailable``, capped by the cgroup's limit where there is one."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        meminfo = FilePath("/proc/meminfo").read_text()
        available = next(
            int(line.split()[1]) * 1024
            for line in meminfo.splitlines()
            if line.startswith("MemAvailable:")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    try:
        limit = FilePath("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(FilePath("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return available
    return available if limit == "max" else min(available, int(limit) - used)


def room_for_a_copy(
    state: Any,
    device: torch.device,
    free: Callable[[torch.device], int | None] = free_bytes,
) -> bool:
    """Whether a receiver can take ``state``'s tensors into new memory and keep its own intact:
    the copy takes at most half of what is ``free`` where each tensor would land, so the
    spike cannot starve the training that follows; not if the free memory is unknown."""
    need: dict[torch.device, int] = {}
    for spec in flatten(state)[2]:
        where = landing(spec, device)
        need[where] = need.get(where, 0) + spec.nbytes
    for where, size in need.items():
        available = free(where)
        if available is None or 2 * size > available:
            return False
    return True


def publish_layout(store: dist.Store, token: str, state: Any) -> None:
    """Publish the layout of ``state`` (the structure a transfer sends) for spares to read."""
    specs = [s.to_json() for s in flatten(state)[2]]
    store.set(LAYOUT_KEY, seal({"purpose": "torchrelay-layout", "specs": specs}, token))


def read_layout(store: dist.Store, token: str) -> list[TensorSpec] | None:
    """The published layout, or None if it is absent, unauthenticated or malformed."""
    try:
        body = unseal(store.get(LAYOUT_KEY), token)
        if body.get("purpose") != "torchrelay-layout":
            return None
        return [TensorSpec.from_json(s) for s in body["specs"]]
    except (WireError, SchemaError, KeyError, TypeError, ValueError, dist.DistStoreError):
        return None


class Prefault:
    """A spare's receive buffers, prepared in a daemon thread while it waits for a plan.

    The thread uses a store client of its own (a client serialises its operations, so a wait
    here would delay the spare's own store traffic), waits for the layout, then allocates and
    faults in every tensor ``own_state`` lacks, one at a time, stopping early if :meth:`take`
    is called first.
    """

    def __init__(
        self, store_address: str, token: str, own_state: Any, device: torch.device
    ) -> None:
        self._address, self._token, self._device = store_address, token, device
        self._own_state = own_state
        self._buffers: dict[Path, torch.Tensor] = {}
        self._stop = threading.Event()
        self._allocating = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchrelay-prefault", daemon=True)
        self._thread.start()
        # A process that exits while this thread fills a buffer dies of SIGABRT in torch's
        # teardown ("terminate called without an active exception"): a spare dismissed at
        # the end of the job as it came up did. However the process exits, stop it first.
        atexit.register(self._halt)

    def take(self) -> dict[Path, torch.Tensor]:
        """Stop preparing; the buffers made so far, by path. Does not wait for the layout."""
        atexit.unregister(self._halt)
        return self._halt()

    def _halt(self) -> dict[Path, torch.Tensor]:
        self._stop.set()
        if self._allocating.is_set():
            self._thread.join()  # at most the tensor being faulted in
        return {} if self._thread.is_alive() else self._buffers

    def finished(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the preparation to end; whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        host, _, port = self._address.rpartition(":")
        try:
            store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False)
            while not self._stop.is_set():
                try:
                    store.wait([LAYOUT_KEY], _WAIT)
                    break
                except dist.DistStoreError:
                    continue
        except (RuntimeError, ValueError):
            return  # no store, no layout: the transfer allocates as it would have
        layout = None if self._stop.is_set() else read_layout(store, self._token)
        if layout is None:
            return
        try:
            own = {s.path: t for t, s in zip(*flatten(self._own_state)[1:], strict=True)}
        except SchemaError:
            return  # a state no transfer can fill: the transfer reports it
        self._allocating.set()
        for spec in layout:
            if self._stop.is_set():
                return
            if fits(spec, own.get(spec.path)):
                continue
            buffer = allocate(spec, self._device)
            as_bytes(buffer).zero_()  # writing maps the pages now, not inside the receive
            self._buffers[spec.path] = buffer
