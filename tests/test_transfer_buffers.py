"""A waiting spare prepares its receive buffers from the published layout; the transfer lands in
them. A layout that is absent, forged or stale changes nothing but speed."""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from tests.test_transfer_engine import _replica
from torchrelay.control.wire import new_token, seal
from torchrelay.transfer.buffers import (
    LAYOUT_KEY,
    Prefault,
    free_bytes,
    publish_layout,
    read_layout,
    room_for_a_copy,
)
from torchrelay.transfer.engine import receive_state, send_state


@pytest.fixture
def store() -> Iterator[tuple[dist.TCPStore, str]]:
    """A real TCPStore on a free loopback port, and its address."""
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(30)
    )
    yield server, f"127.0.0.1:{server.port}"
    del server


def _client(address: str) -> dist.TCPStore:
    """A client of its own per rank thread: one client serialises its operations, and a
    receiver's blocking get would hold a shared one."""
    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(30))


def _spare_state() -> tuple[dict, torch.optim.Optimizer]:
    tracked, _model, opt, _sched = _replica(seed=99, steps=0)
    return {"step": -1, "objects": tracked.state()}, opt


def _source_state() -> dict:
    tracked, *_ = _replica(seed=0, steps=3)
    return {"step": 3, "objects": tracked.state()}


def _prepared(store, address: str, token: str, own: dict) -> dict:
    prefault = Prefault(address, token, {"objects": own["objects"]}, torch.device("cpu"))
    assert prefault.finished(timeout=30)
    return prefault.take()


def test_the_spare_prepares_exactly_what_it_lacks_and_receives_into_it(ranks, store):
    server, address = store
    token = new_token()
    publish_layout(server, token, _source_state())
    own, _opt = _spare_state()
    prepared = _prepared(server, address, token, own)
    # The spare holds its parameters; it lacks the optimizer's moments and step counters.
    assert prepared and all(path[:3] == ("objects", "optimizer", "state") for path in prepared)
    assert all(not t.any() for t in prepared.values())  # every page written

    def body(rank: int, pg: dist.ProcessGroup):
        if rank == 0:
            return send_state(pg, _client(address), token, 1, _source_state(), 0, [0], [1], 256)
        return receive_state(pg, _client(address), token, 1, own, [0], prepared=prepared)

    result = ranks(2, body)[1]
    ref_opt = _replica(seed=0, steps=3)[2]
    state = result.state["objects"]["optimizer"]["state"]
    expected = ref_opt.state_dict()["state"]
    for index, moments in state.items():
        for key, tensor in moments.items():
            assert tensor is prepared[("objects", "optimizer", "state", index, key)]
            assert torch.equal(tensor, expected[index][key])


@pytest.mark.parametrize(
    "raw",
    [b"garbage", seal({"purpose": "torchrelay-layout", "specs": []}, "another job's token")],
    ids=["garbage", "other-job"],
)
def test_a_forged_layout_is_ignored(store, raw):
    server, address = store
    token = new_token()
    server.set(LAYOUT_KEY, raw)
    assert read_layout(server, token) is None
    own, _opt = _spare_state()
    assert _prepared(server, address, token, own) == {}


def test_without_a_layout_take_returns_at_once_with_nothing(store):
    _server, address = store
    own, _opt = _spare_state()
    prefault = Prefault(address, new_token(), {"objects": own["objects"]}, torch.device("cpu"))
    assert prefault.take() == {}


def test_a_stale_buffer_is_not_received_into(ranks, store):
    """Buffers prepared from an older layout that no longer fits are left alone."""
    _server, address = store
    token = new_token()
    own, _opt = _spare_state()
    path = ("objects", "optimizer", "state", 0, "exp_avg")
    stale = torch.zeros(3)

    def body(rank: int, pg: dist.ProcessGroup):
        if rank == 0:
            return send_state(pg, _client(address), token, 1, _source_state(), 0, [0], [1], 256)
        return receive_state(pg, _client(address), token, 1, own, [0], prepared={path: stale})

    result = ranks(2, body)[1]
    received = result.state["objects"]["optimizer"]["state"][0]["exp_avg"]
    assert received is not stale and not stale.any()
    assert received.shape == _replica(seed=0, steps=3)[2].state_dict()["state"][0]["exp_avg"].shape


EXIT_WHILE_PREPARING = """
import torch, torch.distributed as dist
from torchrelay.transfer.buffers import Prefault, publish_layout
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
publish_layout(store, "t", {"w": [torch.empty(64 << 20, dtype=torch.uint8) for _ in range(8)]})
prefault = Prefault(f"127.0.0.1:{store.port}", "t", {}, torch.device("cpu"))
prefault._allocating.wait()
raise SystemExit(0)  # as a spare dismissed at the job's end does, before any take()
"""


def test_a_process_that_exits_while_buffers_are_prepared_exits_cleanly():
    """The interpreter's teardown under a thread still filling a buffer aborted the process
    (SIGABRT: "terminate called without an active exception"); the thread is stopped first."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_PREPARING], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr


def test_a_copy_is_made_only_where_it_takes_at_most_half_of_the_free_memory():
    state = {"weights": torch.zeros(256), "moments": [torch.zeros(256), torch.zeros(2)]}
    need = 4 * (256 + 256 + 2)  # float32
    cpu = torch.device("cpu")
    assert room_for_a_copy(state, cpu, free=lambda _where: 2 * need)
    assert not room_for_a_copy(state, cpu, free=lambda _where: 2 * need - 1)
    assert not room_for_a_copy(state, cpu, free=lambda _where: None)  # unknown: in place
    assert room_for_a_copy({"step": 3}, cpu, free=lambda _where: 0)  # nothing to copy


def test_the_host_has_free_memory_to_report():
    free = free_bytes(torch.device("cpu"))
    assert free is not None and free > 0
