"""Leader election on etcd: a leader key attached to a lease, kept alive by a thread.

:func:`campaign` grants a lease and puts the leader key only if it does not exist (a
transaction comparing its ``create_revision`` with 0). The winner's :class:`EtcdLeadership`
refreshes the lease every third of its TTL and checks that the key is still its own. A loser
watches the key from the revision it saw and tries again once the key is deleted (its holder
resigned, or its lease expired at etcd).

No split brain: the holder's local deadline is the *send* time of the last refresh that etcd
acknowledged plus the TTL; etcd's own expiry is never earlier (it starts counting when it
receives the refresh), and the key is only deleted, so a standby only wins, after that. Past
its deadline the holder is no longer leader (:meth:`EtcdLeadership.is_leader`), and ``lost``
fires; a holder that was paused past it, and wakes believing it leads, is still stopped by
the fence on every state write (see :meth:`EtcdBackend.set_state`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from torchrelay.control.store.base import (
    ElectionTimeout,
    Leadership,
    StoreUnavailable,
    check_ttl,
)
from torchrelay.control.store.etcd_client import EtcdConnection, b64, equal

RETRY_PAUSE = 0.1
"""Seconds between two attempts when etcd is unreachable (it refuses connections at once)."""


class EtcdLeadership(Leadership):
    """A term won by :func:`campaign`; its lease is refreshed until resign, loss or etcd loss."""

    def __init__(
        self,
        conn: EtcdConnection,
        key: str,
        candidate: str,
        revision: int,
        lease: int,
        ttl: int,
        granted_at: float,
        on_lost: Callable[[], None] | None,
    ) -> None:
        super().__init__(candidate, revision, on_lost)
        self.lease = lease
        self.ttl = ttl
        self.deadline = granted_at + ttl  # monotonic; only the keepalive thread moves it
        self._conn = conn
        self._key = key
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._keep_alive, name=f"leader-lease-{candidate}", daemon=True
        )
        self._thread.start()

    def is_leader(self) -> bool:
        return (
            not self._stop.is_set() and not self.lost.is_set() and time.monotonic() < self.deadline
        )

    def resign(self) -> None:
        self._stop.set()
        self._thread.join(self._conn.timeout + 1.0)
        # Revoking deletes the key, so a standby wins at once; if etcd cannot be reached the
        # lease expires there on its own, within its TTL.
        with contextlib.suppress(StoreUnavailable):
            self._conn.revoke(self.lease)
        self._conn.close()

    def _keep_alive(self) -> None:
        period = self.ttl / 3
        next_refresh = self.deadline - self.ttl + period
        while not self._stop.wait(max(0.0, min(next_refresh, self.deadline) - time.monotonic())):
            sent = time.monotonic()
            if sent >= self.deadline:
                self._mark_lost()
                return
            try:
                ttl = self._conn.keepalive(self.lease)
                # The key is ours only while its create_revision is our term's: it is gone
                # if the lease expired, or if someone deleted it by hand.
                held = self._conn.get("leader check", self._key)
            except StoreUnavailable:
                next_refresh = time.monotonic() + min(period, RETRY_PAUSE)
                continue
            if ttl <= 0 or held is None or int(held["create_revision"]) != self.revision:
                self._mark_lost()
                return
            self.deadline = sent + ttl
            next_refresh = sent + period


def campaign(
    connect: Callable[[float | None], EtcdConnection],
    key: str,
    candidate: str,
    ttl: int,
    timeout: float | None,
    on_lost: Callable[[], None] | None,
) -> EtcdLeadership:
    """Block until ``candidate`` holds ``key``; :class:`ElectionTimeout` after ``timeout`` s.

    An unreachable etcd is retried until the timeout (a standby waits out an outage); the
    timeout's message then names the last error.
    """
    check_ttl(ttl)
    conn = connect(None)
    try:
        return _campaign(conn, connect, key, candidate, ttl, timeout, on_lost)
    finally:
        conn.close()


def _campaign(
    conn: EtcdConnection,
    connect: Callable[[float | None], EtcdConnection],
    key: str,
    candidate: str,
    ttl: int,
    timeout: float | None,
    on_lost: Callable[[], None] | None,
) -> EtcdLeadership:
    deadline = None if timeout is None else time.monotonic() + timeout
    last_error = "another candidate leads"
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise ElectionTimeout(
                f"{conn.where}: {candidate!r} did not win within {timeout:g} s: {last_error}"
            )
        try:
            granted_at = time.monotonic()
            lease, granted = conn.grant(ttl)
            answer = conn.txn(
                "campaign",
                compare=[equal(key, "CREATE", 0)],
                success=[
                    {"request_put": {"key": b64(key), "value": b64(candidate), "lease": lease}}
                ],
                failure=[],
            )
            seen = int(answer["header"]["revision"])
            if answer.get("succeeded"):
                # The keepalive thread gets its own connection, so a refresh never queues
                # behind the controller's state writes, and a shorter timeout, so a refresh
                # that hangs is retried, or the term given up, on time.
                keeper = connect(min(conn.timeout, max(0.1, granted / 3)))
                return EtcdLeadership(
                    keeper, key, candidate, seen, lease, granted, granted_at, on_lost
                )
            conn.revoke(lease)
        except StoreUnavailable as exc:
            last_error = str(exc)
            time.sleep(RETRY_PAUSE if left is None else min(RETRY_PAUSE, left))
            continue
        last_error = "another candidate leads"
        wait = ttl if left is None else min(ttl, left)
        # Paced by the delete event; the bounded wait only re-checks a watch that broke.
        conn.wait_deleted(key, seen + 1, wait)
