"""Leader election under faults, on a real etcd: the leader's process is SIGKILLed, etcd is
killed, etcd is paused (SIGSTOP: connections hang, like a partition). The standby wins only
once the old lease expired, the old leader's ``lost`` fires and its writes fail fast, and
never are two leaders at once (each side's own clock: CLOCK_MONOTONIC is system-wide)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import etcd3gw
import pytest

from tests.etcd import EtcdServer
from torchrelay.control.store import NotLeader, SealedStore, StoreUnavailable
from torchrelay.control.store.etcd import EtcdBackend
from torchrelay.control.wire import new_token

SCRIPT = Path(__file__).parent / "scripts" / "etcd_leader.py"
TOKEN = new_token()
SAFETY = 60.0  # seconds: a safety net only; every wait below ends on an event


def campaign_in_thread(
    backend: EtcdBackend, candidate: str, ttl: int
) -> tuple[list, threading.Event]:
    """Campaign in a thread; ``won`` is set (and the time recorded) once it leads."""
    result: list = []
    won = threading.Event()

    def run() -> None:
        leadership = backend.campaign(candidate, ttl, timeout=SAFETY)
        result.append((leadership, time.monotonic()))
        won.set()

    threading.Thread(target=run, daemon=True).start()
    return result, won


def watch_leader(leadership, stop: threading.Event) -> list[float]:
    """Record, in a thread, the last moment ``leadership.is_leader()`` was true."""
    last: list[float] = [0.0]

    def run() -> None:
        while not stop.is_set() and not leadership.lost.is_set():
            now = time.monotonic()
            if leadership.is_leader():
                last[0] = now
            stop.wait(0.002)

    threading.Thread(target=run, daemon=True).start()
    return last


@pytest.mark.slow
@pytest.mark.parametrize("ttl", [1, 3])
def test_standby_wins_after_the_leaders_process_is_killed(etcd: EtcdServer, ttl):
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(etcd.port), "job", str(ttl)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()  # the event: the child leads (it exits if it cannot)
        assert line.startswith("leader "), line
        result, won = campaign_in_thread(EtcdBackend("127.0.0.1", etcd.port, "job"), "b", ttl)
        assert not won.is_set()
        child.kill()
        killed = time.monotonic()
        assert won.wait(SAFETY), "the standby never won after the leader was killed"
        leadership, won_at = result[0]
        # The child refreshed its lease at most ttl/3 before the kill: etcd keeps it (and the
        # key) at least 2/3 of the TTL after; a standby that won sooner broke the lease.
        assert won_at - killed >= ttl * 2 / 3 - 0.05, won_at - killed
        assert leadership.revision > int(line.split()[1])
        leadership.resign()
    finally:
        child.kill()
        child.wait()


def test_etcd_killed_the_leader_is_lost_and_writes_fail_fast(etcd: EtcdServer):
    backend = EtcdBackend("127.0.0.1", etcd.port, "job", timeout=0.5)
    store = SealedStore(backend, TOKEN)
    lost_at: list[float] = []
    leadership = backend.campaign("a", 1, timeout=10, on_lost=lambda: lost_at.append(1))
    _, revision, _ = store.set_state(b"before", 0, fence=leadership)
    etcd.kill()
    assert leadership.lost.wait(SAFETY)
    assert lost_at == [1] and not leadership.is_leader()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"etcd at 127\.0\.0\.1:\d+: write state failed"):
        store.set_state(b"after", revision, fence=leadership)
    assert time.monotonic() - started < 0.5 + 2.0  # bounded by the call timeout, no hang
    leadership.resign()  # etcd is gone: bounded too


def test_leader_key_deleted_by_hand_the_term_is_lost(etcd: EtcdServer):
    backend = EtcdBackend("127.0.0.1", etcd.port, "job")
    leadership = backend.campaign("a", 3, timeout=10)
    etcd3gw.client(host="127.0.0.1", port=etcd.port, timeout=5).delete(backend.leader_key)
    assert leadership.lost.wait(SAFETY), "the leader did not notice its key was deleted"
    assert not leadership.is_leader()
    leadership.resign()


@pytest.mark.slow
def test_etcd_paused_never_two_leaders(etcd: EtcdServer):
    timeout = 0.5
    a_backend = EtcdBackend("127.0.0.1", etcd.port, "job", timeout=timeout)
    a_store = SealedStore(a_backend, TOKEN)
    a = a_backend.campaign("a", 1, timeout=10)
    _, revision, _ = a_store.set_state(b"by a", 0, fence=a)
    stop = threading.Event()
    a_last_leading = watch_leader(a, stop)
    result, b_won = campaign_in_thread(
        EtcdBackend("127.0.0.1", etcd.port, "job", timeout=timeout), "b", 1
    )
    etcd.pause()
    try:
        assert a.lost.wait(SAFETY), "the leader did not notice it lost etcd"
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"no answer within 0\.5 s"):
            a_store.set_state(b"by a, cut off", revision, fence=a)
        assert time.monotonic() - started < timeout + 2.0
        assert not b_won.is_set()  # nobody can win while etcd is unreachable
    finally:
        etcd.resume()
    assert b_won.wait(SAFETY), "the standby never won once etcd came back"
    b, b_won_at = result[0]
    stop.set()
    assert 0 < a_last_leading[0] < b_won_at, (a_last_leading[0], b_won_at)
    assert a.deadline < b_won_at
    # A wakes up thinking it wrote nothing wrong: the fence still refuses it.
    with pytest.raises(NotLeader):
        a_store.set_state(b"by a, deposed", revision, fence=a)
    # The write A sent while cut off timed out at A, but etcd had it queued: it may have been
    # applied on resuming, while A still held the key (a timed-out request is not a refused
    # one). What must never be is a write of A's after B became leader.
    state, written_at = SealedStore(a_backend, TOKEN).get_state()
    assert state == b"by a" or (state == b"by a, cut off" and written_at < b.revision)
    b.resign()
