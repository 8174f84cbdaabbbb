"""Two real processes, each with a stable process group bound to a real gloo group made as a
job makes it (one whose connections can be cut): the tests of the step guard and of cutting
gloo. Every wait is on a store key or a queue, with the store's timeout as the only net."""

from __future__ import annotations

import datetime
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tests.etcd import free_port
from torchrelay.runtime.devices import new_group
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.fast_lane import stable_group
from torchrelay.runtime.guard import StepGuard

TIMEOUT = datetime.timedelta(seconds=60)
Target = Callable[[int, int, "multiprocessing.Queue[Any]"], None]


@dataclass
class Member:
    """One process's side: the job's store, generation 0's gloo group, the guard, the facade."""

    store: dist.TCPStore
    inner: dist.ProcessGroup
    guard: StepGuard
    facade: StableProcessGroup


def plain_group(store: dist.Store, rank: int, size: int) -> dist.ProcessGroup:
    """A ProcessGroup over gloo as torchrun makes it (DDP needs a ProcessGroup, not a bare
    backend): plain DDP, to compare the stable group with."""
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("plain", store), rank, size, TIMEOUT)
    group = dist.ProcessGroup(store, rank, size)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return group


def join_pair(rank: int, port: int) -> Member:
    """In a member process: the store (rank 0 hosts it), the group, and a facade bound to it
    in generation 0, as a job makes it (compiled where the guard is: then its later
    all-reduces and broadcasts run in C++, :mod:`torchrelay.runtime.fast_lane`)."""
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=TIMEOUT)
    inner = new_group(dist.PrefixStore("g0", store), rank, 2, TIMEOUT, torch.device("cpu"))
    guard = StepGuard()
    facade = stable_group(2, guard)
    facade.bind(inner, rank, generation=0)
    guard.enter_generation(0)
    guard.begin_step()  # in a step, as training is (set-up's collectives fail differently)
    return Member(store, inner, guard, facade)


def _then_leave(target: Target, rank: int, port: int, results: multiprocessing.Queue) -> None:
    """``target``, then exit 0 once what it put is in the pipe, without the interpreter's
    teardown: there gloo's own threads abort a process whose peer has left or whose group
    was cut (an IoException thrown in a pair, or pytorch#190489), which is neither the step
    guard's behaviour nor the cut's (3 runs in 25 of a test beside a CPU hog). A job's
    survivor does not exit with a broken group: it enters the next generation's."""
    target(rank, port, results)
    results.close()
    results.join_thread()
    os._exit(0)


def run_pair(target: Target, reports: int) -> list[Any]:
    """Run ``target(rank, port, results)`` in two spawned processes; the ``reports`` items
    they put on ``results``, in order, once both exited 0 (a target that raises exits 1)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    members = [context.Process(target=_then_leave, args=(target, r, port, results)) for r in (0, 1)]
    for member in members:
        member.start()
    got = [results.get(timeout=90) for _ in range(reports)]
    for member in members:
        member.join(30)
    assert [m.exitcode for m in members] == [0, 0]
    return got
