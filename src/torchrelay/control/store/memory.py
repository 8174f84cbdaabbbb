"""The in-memory backend: the default, for a job whose controller lives in one process.

Same contract as etcd (compare-and-swap, one leader at a time) so the controller has one code
path, but nothing outlives the process: a second campaign in the same process waits until the
first leader resigns; a term is never lost (there is no lease to miss).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from torchrelay.control.store.base import (
    ElectionTimeout,
    Leadership,
    NotLeader,
    Revision,
    StateBackend,
    check_ttl,
)


class MemoryLeadership(Leadership):
    """A term on a :class:`MemoryBackend`; held until :meth:`resign`."""

    def __init__(
        self,
        backend: MemoryBackend,
        candidate: str,
        revision: Revision,
        on_lost: Callable[[], None] | None,
    ) -> None:
        super().__init__(candidate, revision, on_lost)
        self._backend = backend
        self._resigned = False

    def is_leader(self) -> bool:
        return not self._resigned

    def resign(self) -> None:
        self._resigned = True
        self._backend._release(self)


class MemoryBackend(StateBackend):
    """State and leader in this process's memory; every call answers at once."""

    where = "memory"

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state: bytes | None = None
        self._revision: Revision = 0
        self._counter = 0  # one sequence for state writes and terms, like etcd's revision
        self._leader: MemoryLeadership | None = None
        self._records: dict[str, bytes] = {}

    def get_state(self) -> tuple[bytes | None, Revision]:
        with self._cond:
            return self._state, self._revision

    def set_state(
        self, state: bytes, revision: Revision, fence: Leadership | None = None
    ) -> tuple[bytes | None, Revision, bool]:
        with self._cond:
            if fence is not None and self._leader is not fence:
                raise NotLeader(f"{fence.candidate!r} no longer leads: state not written")
            if revision != self._revision:
                return self._state, self._revision, False
            self._counter += 1
            self._state, self._revision = bytes(state), self._counter
            return self._state, self._revision, True

    def campaign(
        self,
        candidate: str,
        ttl: int,
        timeout: float | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> Leadership:
        check_ttl(ttl)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._leader is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise ElectionTimeout(
                        f"{candidate!r} did not win within {timeout} s: "
                        f"{self._leader.candidate!r} leads"
                    )
                self._cond.wait(left)
            self._counter += 1
            self._leader = MemoryLeadership(self, candidate, self._counter, on_lost)
            return self._leader

    def publish(self, name: str, value: bytes, fence: Leadership) -> None:
        with self._cond:
            if self._leader is not fence:
                raise NotLeader(f"{fence.candidate!r} no longer leads: {name} not published")
            self._records[name] = bytes(value)

    def lookup(self, name: str) -> bytes | None:
        with self._cond:
            return self._records.get(name)

    def check(self) -> None:
        return None

    def close(self) -> None:
        return None

    def _release(self, leadership: MemoryLeadership) -> None:
        with self._cond:
            if self._leader is leadership:
                self._leader = None
                self._cond.notify_all()
