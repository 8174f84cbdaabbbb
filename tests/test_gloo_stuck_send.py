"""A gloo send left in its pair's transmit queue is not ended by a cut (torch 2.13's gloo does
not signal queued sends of unbound buffers when a pair fails): the aborted collective's
process leaves with EXIT_COMMUNICATOR_STUCK within the facade's grace, instead of holding the
job until the collective timeout. Two real processes over a real gloo group; paced by the
receiver's first bytes, its stop and the sender's exit."""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any

import pytest
import torch

from tests.etcd import free_port
from tests.gloo_pair import TIMEOUT, join_pair
from torchrelay.exits import EXIT_COMMUNICATOR_STUCK

pytestmark = pytest.mark.timeout(180)

# Far more than the socket buffers: the root's write stays partial once the receiver stops.
ELEMENTS = 128 << 20  # 512 MiB of float32


def _member(rank: int, port: int, stopped: Any) -> None:
    pair = join_pair(rank, port)
    guard, facade = pair.guard, pair.facade
    facade.allreduce([torch.ones(4)]).wait()  # both published their ports: the group is cut-able
    if rank == 1:
        received = torch.zeros(ELEMENTS)
        facade.broadcast([received])  # gloo writes straight into it as the bytes come
        while received[0].item() == 0.0:
            pass  # the root's send has started: stop reading mid-way
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    sent = torch.ones(ELEMENTS)
    work = facade.broadcast([sent])  # in place
    stopped.wait(TIMEOUT.total_seconds())
    guard.abort(0)  # what the runtime does when the controller aborts the generation
    facade.abort(0)  # cuts the group: every socket of it closes
    work.wait()  # never returns: the process leaves from the facade's watcher
    os._exit(0)


def test_aborted_collective_stuck_in_a_partial_send_makes_its_process_leave():
    context = multiprocessing.get_context("spawn")
    stopped = context.Event()
    port = free_port()
    root, receiver = (context.Process(target=_member, args=(r, port, stopped)) for r in (0, 1))
    root.start()
    receiver.start()
    try:
        _, status = os.waitpid(receiver.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        stopped.set()
        root.join(TIMEOUT.total_seconds())
        assert root.exitcode == EXIT_COMMUNICATOR_STUCK
    finally:
        for member in (root, receiver):
            if member.is_alive():
                os.kill(member.pid, signal.SIGKILL)
        receiver.join(30)
