"""Where the job's controller is now: the endpoint record its leader publishes in the state store.

The leader of a job with a state store (``--state etcd://...``) publishes, fenced by its term,
an :class:`Endpoint`: its control RPC address, the rendezvous store it serves, and its term.
When a process loses the controller (the stream breaks, calls time out) its
:class:`ControlClient` asks a :class:`Failover` for a *newer* endpoint and moves to it. A
standby that took the lead has published one; until then there is none, and the caller's own
lease decides how long it may wait (see :mod:`torchrelay.control.lease`).

The record is sealed with the job token, so only this job's leader can name an endpoint; a
record that fails authentication is ignored, never followed. Imports neither torch nor the
controller: workers and node agents use it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from torchrelay.control.store import (
    Leadership,
    StateBackend,
    StoreError,
    StoreKind,
    StoreSpec,
    open_backend,
    parse_store_url,
)
from torchrelay.control.wire import WireError, seal, unseal

RECORD = "endpoint"
POLL_INTERVAL = 0.25
"""Seconds between two looks for a new leader while a client waits for one."""


@dataclass(frozen=True)
class Endpoint:
    """The controller that leads ``term``: its control RPC and its rendezvous store."""

    control: str
    store: str
    term: int


def publish(backend: StateBackend, token: str, endpoint: Endpoint, fence: Leadership) -> None:
    """Name ``endpoint`` as the job's controller (only while ``fence`` leads)."""
    body = {"control": endpoint.control, "store": endpoint.store, "term": endpoint.term}
    backend.publish(RECORD, seal(body, token), fence)


def read(backend: StateBackend, token: str) -> Endpoint | None:
    """The published endpoint; ``None`` when none is, or when it fails authentication."""
    raw = backend.lookup(RECORD)
    if raw is None:
        return None
    try:
        body = unseal(raw, token)
        control, store, term = body["control"], body["store"], body["term"]
    except (WireError, KeyError, TypeError):
        return None
    if not (isinstance(control, str) and isinstance(store, str) and type(term) is int):
        return None
    return Endpoint(control, store, term)


class Failover:
    """Finds the controller that leads after the one a client used is gone.

    ``newer(failed)`` looks once: an endpoint of a later term than any this client followed,
    at another address than ``failed``. The backend is opened on first use (a client that
    never loses its controller never talks to the store).
    """

    def __init__(self, spec: StoreSpec, token: str) -> None:
        self._spec = spec
        self._token = token
        self._backend: StateBackend | None = None
        self._lock = threading.Lock()
        self.term = 0  # the term of the endpoint last followed (0: the first leader's)

    def newer(self, failed: str) -> Endpoint | None:
        with self._lock:
            try:
                if self._backend is None:
                    self._backend = open_backend(self._spec)
                found = read(self._backend, self._token)
            except StoreError:
                return None
            if found is None or found.term <= self.term or found.control == failed:
                return None
            self.term = found.term
            return found


def failover_for(state: str, token: str) -> Failover | None:
    """The failover of a process told ``TORCHRELAY_STATE=state`` (``None``: no state store,
    so no standby can take over)."""
    if not state:
        return None
    spec = parse_store_url(state)
    return None if spec.kind is StoreKind.MEMORY else Failover(spec, token)
