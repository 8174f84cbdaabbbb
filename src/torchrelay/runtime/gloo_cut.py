"""An abort for gloo: shutting down the TCP connections of one communicator.

Gloo has no ``ncclCommAbort``. Measured with torch 2.13: neither ``ProcessGroupGloo.abort()``
nor ``shutdown()`` ends a work that waits for a stopped peer, and the work still completes into
its buffer once the peer resumes, seconds later. A collective could therefore never run in the
caller's own buffers (DDP's gradient buckets): a dead generation might write into them during a
later step. What does end such a work is its sockets: ``shutdown(SHUT_RDWR)`` on the
communicator's connected pair sockets makes every pending send and receive fail at once
("Connection closed by peer", about 1 ms here), and a peer that resumes later fails too, its
bytes never landing. Shutting the *listening* socket instead makes gloo abort the process
(``listener.cc: accept: Invalid argument``), so only connected sockets are touched.

:func:`capture` builds a gloo group and notes the socket descriptors that appeared meanwhile
(gloo connects its full mesh eagerly), as duplicates of gloo's, so that a descriptor number gloo
closes and the kernel hands out again can never be cut by mistake. Each member publishes its
group's listening ports in the generation's store; :meth:`PairSockets.resolve` keeps, once
every peer's are there, exactly the connections to or from one of them (a socket another thread
opened meanwhile matches none and is never touched). :meth:`PairSockets.cut` shuts them down
and closes the duplicates, which also lets the connections close once gloo closes its own.
Idempotent and thread-safe; never raises, never waits for a peer.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable

import torch.distributed as dist

LISTEN_KEY = "torchrelay-gloo-listen/{rank}"


class PairSockets:
    """One gloo communicator's connected pair sockets, as duplicates of gloo's descriptors.

    Built from the candidates (every TCP connection that appeared while the group was built)
    and resolved once every peer's listening ports are in the store: :meth:`resolve` never
    waits for them (a peer that died before publishing must not stall this process), so until
    then the group counts as not cuttable and its collectives keep their private copies.
    """

    def __init__(
        self,
        candidates: dict[int, tuple[int, int]],
        mine: set[int],
        store: dist.Store,
        keys: list[str],
    ) -> None:
        self._candidates = candidates  # duplicate fd -> (local port, remote port)
        self._mine, self._store, self._keys = mine, store, keys
        self._pairs: list[int] | None = None if keys else self._match(set())
        self._lock = threading.Lock()

    def _match(self, theirs: set[int]) -> list[int]:
        """Keep the connections to or from a listening port of the group; close the rest."""
        pairs = []
        for fd, (local, remote) in self._candidates.items():
            if local in self._mine or remote in theirs:
                pairs.append(fd)
            else:
                os.close(fd)
        self._candidates = {}
        return pairs

    def resolve(self) -> bool:
        """Whether the pair sockets are known (and there are some); never blocks on a peer."""
        with self._lock:
            if self._pairs is None:
                try:
                    if not self._store.check(self._keys):
                        return False
                    raw = self._store.multi_get(self._keys)
                except (RuntimeError, dist.DistError):
                    return False
                self._pairs = self._match({port for r in raw for port in json.loads(r)})
            return len(self._pairs) > 0

    def cut(self) -> None:
        """Shut down every connection of the communicator (see the module doc) and close the
        duplicates. Unresolved, only the connections accepted on the group's own listening
        port are known to be its own: the group's collectives never ran in place then."""
        with self._lock:
            if self._pairs is None:
                self._pairs = self._match(set())  # no peer's ports: only our own listener's
            fds, self._pairs = self._pairs, []
        for fd in fds:
            with contextlib.suppress(OSError):
                sock = socket.socket(fileno=fd)  # owns the duplicate from here
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def _socket_fds() -> set[int]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(int(name))
    return found


def _ports(fd: int) -> tuple[int | None, int | None, bool]:
    """(local port, remote port, listening) of a TCP socket; Nones for anything else."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None, None, False
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None, None, False
        local = sock.getsockname()[1]
        listening = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        try:
            remote = sock.getpeername()[1]
        except OSError:
            remote = None
        return local, remote, listening
    except OSError:
        return None, None, False
    finally:
        sock.close()


def capture(
    create: Callable[[], dist.ProcessGroup], store: dist.Store, rank: int, size: int
) -> tuple[dist.ProcessGroup, PairSockets]:
    """Build a gloo group with ``create`` and note its candidate pair sockets (see the module
    doc and :class:`PairSockets`); ``store`` is the generation's, shared by the ``size``
    members. Never waits for a peer beyond what ``create`` itself does."""
    before = _socket_fds()
    group = create()
    ports = {fd: _ports(fd) for fd in sorted(_socket_fds() - before)}
    mine = {local for local, _, listening in ports.values() if listening and local}
    store.set(LISTEN_KEY.format(rank=rank), json.dumps(sorted(mine)))
    candidates: dict[int, tuple[int, int]] = {}
    for fd, (local, remote, listening) in ports.items():
        if local is not None and remote is not None and not listening:
            with contextlib.suppress(OSError):
                candidates[os.dup(fd)] = (local, remote)
    others = [LISTEN_KEY.format(rank=r) for r in range(size) if r != rank]
    return group, PairSockets(candidates, mine, store, others)
