"""The state-store interface: a revisioned blob with compare-and-swap, and a leader lease.

Modelled on ``torch.distributed.elastic.rendezvous.RendezvousBackend``: the store keeps one
opaque state blob and a revision token; :meth:`StateBackend.set_state` writes only if the
stored revision is still the one the caller read, so two controllers can never both write (the
loser gets the current state back and re-decides). :meth:`StateBackend.campaign` elects the one
controller that may act: it returns a :class:`Leadership` whose :attr:`Leadership.lost` is set,
and whose ``on_lost`` callback runs, the moment it can no longer be sure it still leads.

Backends store raw bytes; :class:`torchrelay.control.store.sealed.SealedStore` seals them with
the job token on top, so a backend never decides anything from what it reads.

Every call is bounded: a backend that cannot answer within its timeout raises
:class:`StoreUnavailable` (one line, naming the store and the operation), never hangs.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

Revision = int
"""A state's revision token: 0 when there is no state; otherwise opaque, compare for equality."""


class StoreError(RuntimeError):
    """A state-store failure; the message is one actionable line."""


class StoreUnavailable(StoreError):
    """The store did not answer within its timeout, or refused the connection."""


class NotLeader(StoreError):
    """A fenced write by a leadership that is no longer the current one (it was deposed)."""


class ElectionTimeout(StoreError):
    """``campaign`` did not win within its timeout (another candidate kept the lead)."""


def check_ttl(ttl: int) -> None:
    """A lease is whole seconds (etcd's unit), at least one."""
    if not isinstance(ttl, int) or ttl < 1:
        raise ValueError(
            f"a leader lease needs a TTL of a whole number of seconds >= 1, not {ttl!r}"
        )


class Leadership(ABC):
    """The right to act for the job, held until :meth:`resign` or until it is lost.

    ``revision`` identifies this term (unique per win; fenced writes compare it). ``lost`` is
    set once the lease may have expired at the store; the holder must stop acting then (no
    split brain): :meth:`is_leader` tells it synchronously, from the local clock, even if the
    thread that sets ``lost`` has not run yet. Both are final: a lost term never comes back.
    """

    def __init__(
        self, candidate: str, revision: Revision, on_lost: Callable[[], None] | None
    ) -> None:
        self.candidate = candidate
        self.revision = revision
        self.lost = threading.Event()
        self._on_lost = on_lost
        self._lost_once = threading.Lock()

    @abstractmethod
    def is_leader(self) -> bool:
        """True while this term is certainly still held (checked against the lease deadline)."""

    @abstractmethod
    def resign(self) -> None:
        """Give up the lead now (best effort at the store; the lease expires anyway)."""

    def _mark_lost(self) -> None:
        """Set ``lost`` and run ``on_lost`` exactly once."""
        with self._lost_once:
            if self.lost.is_set():
                return
            self.lost.set()
        if self._on_lost is not None:
            self._on_lost()


class StateBackend(ABC):
    """One job's state blob with compare-and-swap, and its leader election."""

    where = "the state store"
    """Names the store in error messages."""

    @abstractmethod
    def get_state(self) -> tuple[bytes | None, Revision]:
        """The stored state and its revision, or ``(None, 0)`` when nothing is stored."""

    @abstractmethod
    def set_state(
        self, state: bytes, revision: Revision, fence: Leadership | None = None
    ) -> tuple[bytes | None, Revision, bool]:
        """Write ``state`` if the stored revision is still ``revision``.

        Returns ``(state, new revision, True)`` when written, else ``(current state, its
        revision, False)`` so the caller can re-decide from what is really there. With
        ``fence``, the write also requires that term to still hold the lead, else
        :class:`NotLeader` is raised: a deposed leader can never write, even if its ``lost``
        has not fired yet (a paused process).
        """

    @abstractmethod
    def campaign(
        self,
        candidate: str,
        ttl: int,
        timeout: float | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> Leadership:
        """Block until ``candidate`` holds the lead (a lease of ``ttl`` seconds), or until
        ``timeout`` seconds pass (:class:`ElectionTimeout`).

        ``on_lost`` runs once, in the thread that keeps the lease, when the term is lost: it
        must return quickly (set a flag, signal a loop), never wait on the store.
        """

    @abstractmethod
    def publish(self, name: str, value: bytes, fence: Leadership) -> None:
        """Store ``value`` under ``name`` (a record beside the state, e.g. the control
        endpoint), only while ``fence`` holds the lead (else :class:`NotLeader`)."""

    @abstractmethod
    def lookup(self, name: str) -> bytes | None:
        """The record stored under ``name``, or ``None``."""

    @abstractmethod
    def check(self) -> None:
        """Raise :class:`StoreUnavailable` unless the store answers now."""

    @abstractmethod
    def close(self) -> None:
        """Release connections (a held leadership is not resigned: call ``resign``)."""

    def __enter__(self) -> StateBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
