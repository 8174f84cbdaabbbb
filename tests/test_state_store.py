"""The state-store contract, run against both backends: compare-and-swap (two writers, one
wins, the loser gets the winner's state), the job-token seal, fenced writes, one leader at a
time. etcd is the real daemon (tests/etcd.py), started on a free loopback port per test."""

from __future__ import annotations

import base64
import json
import threading
import zlib
from collections.abc import Callable, Iterator

import etcd3gw
import pytest

from tests.etcd import require_etcd, start_etcd
from torchrelay.config import JobConfig
from torchrelay.control import membership
from torchrelay.control.persistence import durable_view, lead
from torchrelay.control.protocol import JoinRequest
from torchrelay.control.state import JobState
from torchrelay.control.store import (
    ElectionTimeout,
    NotLeader,
    SealedStore,
    StateBackend,
    StateTampered,
)
from torchrelay.control.store.etcd import EtcdBackend
from torchrelay.control.store.memory import MemoryBackend
from torchrelay.control.wire import new_token, seal

TOKEN = new_token()


@pytest.fixture(params=["memory", "etcd"])
def connect(request, tmp_path) -> Iterator[Callable[[], StateBackend]]:
    """``connect()`` opens one more client of the same store (a second controller)."""
    opened: list[StateBackend] = []
    if request.param == "memory":
        shared = MemoryBackend()
        yield lambda: shared
        return
    require_etcd()
    server = start_etcd(tmp_path / "etcd")

    def new() -> StateBackend:
        opened.append(EtcdBackend("127.0.0.1", server.port, "job"))
        return opened[-1]

    try:
        yield new
    finally:
        for backend in opened:
            backend.close()
        server.kill()


def test_empty_store_has_no_state(connect):
    assert SealedStore(connect(), TOKEN).get_state() == (None, 0)


def test_cas_conflict_one_writer_wins_the_loser_gets_its_state(connect):
    a, b = SealedStore(connect(), TOKEN), SealedStore(connect(), TOKEN)
    _, seen_a = a.get_state()
    _, seen_b = b.get_state()
    state, revision, written = a.set_state(b'{"generation": 1}', seen_a)
    assert state == b'{"generation": 1}'
    assert written and revision != seen_a
    current, current_revision, written_b = b.set_state(b'{"generation": 99}', seen_b)
    assert not written_b
    assert (current, current_revision) == (b'{"generation": 1}', revision)
    assert b.get_state() == (b'{"generation": 1}', revision)
    # Re-decided on what is there, the loser's next write goes through.
    _, newer, written_b = b.set_state(b'{"generation": 2}', current_revision)
    assert written_b and a.get_state() == (b'{"generation": 2}', newer)


def test_concurrent_read_modify_write_loses_no_update(connect):
    stores = [SealedStore(connect(), TOKEN) for _ in range(3)]
    per_writer = 8

    def bump(store: SealedStore) -> None:
        for _ in range(per_writer):
            state, revision = store.get_state()
            while True:
                value = int(state or b"0") + 1
                state, revision, written = store.set_state(str(value).encode(), revision)
                if written:
                    break

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    assert stores[0].get_state()[0] == str(len(stores) * per_writer).encode()


def test_another_jobs_state_is_refused(connect):
    SealedStore(connect(), new_token()).set_state(b"theirs", 0)
    with pytest.raises(StateTampered, match="failed authentication"):
        SealedStore(connect(), TOKEN).get_state()
    with pytest.raises(StateTampered):  # the state a lost CAS hands back is checked too
        SealedStore(connect(), TOKEN).set_state(b"ours", 0)


def test_two_candidates_exactly_one_leader(connect):
    first = connect().campaign("a", ttl=5, timeout=10)
    assert first.is_leader()
    with pytest.raises(ElectionTimeout, match="'b' did not win"):
        connect().campaign("b", ttl=5, timeout=0.5)
    assert first.is_leader()
    won = threading.Event()
    second: list = []

    def stand_by() -> None:
        second.append(connect().campaign("b", ttl=5, timeout=60))
        won.set()

    standby = threading.Thread(target=stand_by)
    standby.start()
    first.resign()
    assert won.wait(60), "the standby did not win after the leader resigned"
    standby.join()
    assert second[0].is_leader() and not first.is_leader()
    assert second[0].revision != first.revision
    second[0].resign()


def test_a_lease_is_whole_seconds(connect):
    with pytest.raises(ValueError, match="whole number of seconds >= 1"):
        connect().campaign("a", ttl=0, timeout=1)


def test_a_deposed_leaders_fenced_write_is_refused(connect):
    store = SealedStore(connect(), TOKEN)
    first = store.backend.campaign("a", ttl=5, timeout=10)
    _, revision, written = store.set_state(b"by a", 0, fence=first)
    assert written
    first.resign()
    second = connect().campaign("b", ttl=5, timeout=10)
    with pytest.raises(NotLeader, match="'a' no longer leads"):
        store.set_state(b"by a, deposed", revision, fence=first)
    _, _, written = SealedStore(connect(), TOKEN).set_state(b"by b", revision, fence=second)
    assert written
    assert store.get_state()[0] == b"by b"
    second.resign()


def test_a_16384_rank_jobs_state_is_stored_and_read_back(connect, tmp_path):
    """Its JSON is 4.4 MB, over etcd's default 1.5 MiB request limit: stored deflated."""
    config = JobConfig("t.py", [], nproc_per_node=8, run_dir=tmp_path, nnodes=2048, spares=0)
    job = JobState(local_node="node0", hang_timeout=10.0)
    for rank in range(config.world_size):
        request = JoinRequest(role="worker", pid=rank + 2, node=f"node{rank // 8}", slot=rank)
        membership.join(job, config, f"worker{rank}", request, 1000.0)
    persister = lead(connect(), TOKEN, "me")
    persister.save(job)
    view = json.dumps(durable_view(job), sort_keys=True, separators=(",", ":"))
    assert len(view) > 4_000_000
    stored, _ = SealedStore(connect(), TOKEN).get_state()  # as a successor reads it
    assert stored is not None and json.loads(stored) == json.loads(view)


def test_a_state_stored_by_an_earlier_version_still_opens(connect):
    """Stored whole, not deflated, as before 2026-12-07 (a job that ended in this prefix)."""
    backend = connect()
    backend.set_state(
        seal({"state": base64.b64encode(b'{"phase": "succeeded"}').decode()}, TOKEN), 0
    )
    assert SealedStore(connect(), TOKEN).get_state()[0] == b'{"phase": "succeeded"}'


def test_tampered_value_written_with_the_client_is_refused(tmp_path):
    require_etcd()
    server = start_etcd(tmp_path / "etcd")
    try:
        backend = EtcdBackend("127.0.0.1", server.port, "job")
        store = SealedStore(backend, TOKEN)
        store.set_state(b'{"generation": 3}', 0)
        raw = backend.get_state()[0]
        assert raw is not None
        client = etcd3gw.client(host="127.0.0.1", port=server.port, timeout=5)
        # The state edited after sealing (the MAC no longer matches), a well-formed envelope
        # sealed with a guessed token, and bytes that are not sealed: all refused.
        mac, _, payload = raw.partition(b".")
        envelope = json.loads(payload)
        envelope["body"]["deflated"] = base64.b64encode(
            zlib.compress(b'{"generation": 4}')
        ).decode()
        client.put(backend.state_key, mac + b"." + json.dumps(envelope).encode())
        with pytest.raises(StateTampered, match="revision"):
            store.get_state()
        client.put(backend.state_key, seal({"state": "e30="}, "guessed-token"))
        with pytest.raises(StateTampered):
            store.get_state()
        client.put(backend.state_key, b"not sealed at all")
        with pytest.raises(StateTampered):
            store.get_state()
        backend.close()
    finally:
        server.kill()
