"""Cutting a gloo communicator (runtime/gloo_cut.py): what lets the stable group run its
collectives in the caller's own buffers. Two real processes over a real gloo group; every
wait is on a store key, with the store's timeout as the only net."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket

import pytest
import torch
import torch.distributed as dist

from tests.etcd import free_port
from tests.gloo_pair import TIMEOUT, join_pair, run_pair
from torchrelay.runtime.devices import abort_group, cuttable, new_group
from torchrelay.runtime.gloo_cut import PairSockets

pytestmark = pytest.mark.timeout(120)


def _member(rank: int, port: int, results: multiprocessing.Queue) -> None:
    pair = join_pair(rank, port)
    store, inner, guard, facade = pair.store, pair.inner, pair.guard, pair.facade
    summed = torch.full((1 << 18,), float(rank + 1))
    facade.allreduce([summed]).wait()
    # Every member published its listening ports before it could take part in that all-reduce.
    in_place = cuttable(inner)
    again = torch.full((1 << 18,), float(rank + 1))
    facade.allreduce([again]).wait()
    summed = summed if again.unique().tolist() == [3.0] else again
    if rank == 1:  # a peer that stops before the next all-reduce and comes back after the cut
        store.wait(["cut"])
        late = torch.full((1 << 18,), 7.0)
        try:
            inner.allreduce([late]).wait()
            outcome = "completed"
        except RuntimeError:
            outcome = "failed"
        store.set("sent", outcome)
        results.put((rank, outcome))
        store.wait(["done"])
        store.set("left", "1")  # rank 0 hosts the store: it leaves last
        return
    buffer = torch.full((1 << 18,), 5.0)
    work = facade.allreduce([buffer])  # in place: ``buffer`` is the work's own
    guard.abort(0)  # what the runtime does when the controller aborts the generation
    facade.abort(0)
    work.wait()
    store.set("cut", "1")
    late = store.get("sent").decode()
    outcome = (in_place, summed[0].item(), buffer.unique().tolist(), guard.poisoned, late)
    results.put((rank, *outcome, guard.native))
    store.set("done", "1")
    store.wait(["left"])


def test_an_aborted_all_reduce_never_writes_into_the_callers_buffer_even_when_the_peer_resumes(
    guard_kind,
):
    got = dict((item[0], item[1:]) for item in run_pair(_member, reports=2))
    in_place, summed, buffer, poisoned, late, native = got[0]
    assert native == (guard_kind == "compiled")
    assert in_place and summed == 3.0  # from here collectives run in place
    assert buffer == [5.0] and poisoned  # the aborted one left the buffer as it was
    assert late == "failed" and got[1] == ("failed",)  # the resumed peer's bytes never landed


def test_a_cut_touches_only_the_groups_own_connections():
    """Of the connections that appeared while a group was built, those to or from a listening
    port of the group are shut down; another one (a thread's own) is left open."""
    own, peers, elsewhere = (socket.create_server(("127.0.0.1", 0)) for _ in range(3))
    inbound = socket.create_connection(own.getsockname())  # a peer connecting to us
    accepted, _ = own.accept()
    outbound = socket.create_connection(peers.getsockname())  # us connecting to a peer
    at_peer, _ = peers.accept()
    other = socket.create_connection(elsewhere.getsockname())  # someone else's connection
    at_other, _ = elsewhere.accept()
    store = dist.HashStore()
    store.set("listen/1", json.dumps([peers.getsockname()[1]]))
    candidates = {
        os.dup(s.fileno()): (s.getsockname()[1], s.getpeername()[1])
        for s in (accepted, outbound, other)
    }
    pairs = PairSockets(candidates, {own.getsockname()[1]}, store, ["listen/1"])
    assert pairs.resolve()
    pairs.cut()
    assert inbound.recv(1) == b"" and at_peer.recv(1) == b""  # both ends see the close
    other.sendall(b"still open")
    assert at_other.recv(16) == b"still open"
    for sock in (own, peers, elsewhere, inbound, accepted, outbound, at_peer, other, at_other):
        sock.close()


def test_a_group_of_one_runs_on_private_copies():
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=TIMEOUT)
    group = new_group(dist.PrefixStore("g0", store), 0, 1, TIMEOUT, torch.device("cpu"))
    assert not cuttable(group)  # no connections to cut
    abort_group(group)
