"""The device a process computes on, and the communicator that goes with it.

CPU processes (and CPU-only machines) use gloo. A process on a machine with CUDA takes the GPU
``LOCAL_RANK`` (spares get the lowest index no live process of their node holds, see
:meth:`NodeAgent.start_spare`) and NCCL, with two choices that live recovery depends on:

- the communicator is created *non-blocking* and connected eagerly at the generation's
  rendezvous, so that ``ncclCommAbort`` can later interrupt a collective that will never
  complete (a dead peer) instead of leaving a kernel spinning on the GPU forever;
- an aborted generation's communicator is aborted at once (:func:`abort_group`): its pending
  kernels are released and the device's streams are usable by the next generation. Gloo has
  no such abort: its connections are cut instead (:mod:`gloo_cut`), which ends its pending
  works within milliseconds.

``TORCHRELAY_DEVICE=cpu`` forces the CPU path on a machine with GPUs. ``TORCHRELAY_DEVICE=cuda:N``
puts every process of the node, spares too, on GPU ``N``: NCCL refuses two ranks on one device,
so the communicator is then gloo, which reduces CUDA tensors through host memory. It exists to
run a job with recovery on a machine with a single GPU (a check, not a way to train).
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from torchrelay.runtime.gloo_cut import PairSockets, capture

# Gloo waits up to five times its timeout for a pair's first connection (tcp/pair.h: "a longer
# timeout when waiting for initial connect"). A member that another member's failure left
# waiting for a connection nobody will make (that member, its own rendezvous failed, gave up
# before connecting) waited 5 x 30 s, past the 120 s halt timeout, and the job failed.
GLOO_CONNECT_WAIT_FACTOR = 5

# Gloo groups whose pair sockets were found (id -> the group itself, to tell a reused id).
_cuttable: dict[int, tuple[dist.ProcessGroup, PairSockets]] = {}
_cuttable_lock = threading.Lock()


class DeviceError(RuntimeError):
    """This process cannot get the device it was given; the message says why."""


def shared_gpu() -> int | None:
    """The GPU every process of the node shares (``TORCHRELAY_DEVICE=cuda:N``), else ``None``;
    :class:`DeviceError` for a value that is neither that nor ``cpu``."""
    forced = os.environ.get("TORCHRELAY_DEVICE", "")
    if forced in ("", "cpu"):
        return None
    kind, _, index = forced.partition(":")
    if kind != "cuda" or not index.isdigit():
        raise DeviceError(
            f"TORCHRELAY_DEVICE={forced!r}: use cpu, or cuda:N to put every process on GPU N"
        )
    return int(index)


def select_device(local_index: int) -> torch.device:
    """``cuda:local_index`` (made the current device) when CUDA is usable, else the CPU; the
    shared GPU instead of ``local_index`` with ``TORCHRELAY_DEVICE=cuda:N``."""
    shared = shared_gpu()
    if os.environ.get("TORCHRELAY_DEVICE", "") == "cpu" or not torch.cuda.is_available():
        if shared is not None:
            raise DeviceError(f"TORCHRELAY_DEVICE=cuda:{shared} but CUDA is not available here")
        return torch.device("cpu")
    local_index = local_index if shared is None else shared
    count = torch.cuda.device_count()
    if not 0 <= local_index < count:
        raise DeviceError(
            f"this process was given GPU {local_index} but only {count} are visible: lower "
            "--nproc-per-node + --spares to the GPUs of the node, or set TORCHRELAY_DEVICE=cpu"
        )
    device = torch.device("cuda", local_index)
    # Before anything touches CUDA, so no context is ever created on GPU 0 by accident.
    torch.cuda.set_device(device)
    return device


def new_group(
    store: dist.Store,
    rank: int,
    size: int,
    timeout: timedelta,
    device: torch.device,
    connect_within: timedelta | None = None,
) -> dist.ProcessGroup:
    """A generation's communicator over ``store`` (already prefixed with the generation):
    NCCL for a GPU of its own, gloo on the CPU or on a shared GPU (with its pair sockets
    found, so that :func:`abort_group` can cut them: :mod:`gloo_cut`).

    ``timeout`` bounds its collectives. Gloo's rendezvous (the store waits for the peers'
    addresses, then the connections) is bounded by ``connect_within`` if shorter: nothing can
    interrupt it, so a member that dies inside it holds the others that long, after which
    they raise (``DistStoreError`` or gloo's connect timeout). Gloo is given a fifth of it,
    as it waits five times its timeout for a connection (:data:`GLOO_CONNECT_WAIT_FACTOR`).
    NCCL's keeps ``timeout``."""
    if device.type != "cuda" or shared_gpu() is not None:
        connect = timeout if connect_within is None else min(timeout, connect_within)
        gloo_timeout = connect / GLOO_CONNECT_WAIT_FACTOR
        group, sockets = capture(
            lambda: dist.ProcessGroupGloo(store, rank, size, gloo_timeout), store, rank, size
        )
        group.set_timeout(timeout)
        with _cuttable_lock:
            _cuttable[id(group)] = (group, sockets)
        return group
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    options.config.blocking = False
    group = dist.ProcessGroupNCCL(store, rank, size, options)
    group.eager_connect_single_device(device)
    return group


def abort_group(group: dist.ProcessGroup) -> None:
    """End every pending operation of ``group`` now, for good: ``ncclCommAbort`` for NCCL,
    its connections cut for a gloo group of :func:`new_group`. Idempotent."""
    if group.name() == "nccl":
        group.abort()
        return
    with _cuttable_lock:
        entry = _cuttable.pop(id(group), None)
    if entry is not None and entry[0] is group:
        entry[1].cut()


def cuttable(group: dist.ProcessGroup) -> bool:
    """Whether :func:`abort_group` ends ``group``'s pending works (so that they may run in the
    caller's own buffers): a gloo group of :func:`new_group` not cut yet, with its sockets
    found. NCCL's abort does too, but its collectives keep their private copies (cheap device
    copies) until they are tested on a GPU."""
    with _cuttable_lock:
        entry = _cuttable.get(id(group))
    return entry is not None and entry[0] is group and entry[1].resolve()


def comm_device(group: dist.ProcessGroup) -> torch.device:
    """Where the tensors a communicator moves must live: the current GPU for NCCL."""
    if group.name() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
