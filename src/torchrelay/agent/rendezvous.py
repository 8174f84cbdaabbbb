"""The job's rendezvous store, listening on the rendezvous address only.

torch's ``TCPStore`` server binds every interface and has no authentication. We bind the
listening socket ourselves to ``--rdzv-endpoint``'s host, so a loopback endpoint is reachable
from this machine only, and hand it to the store (``master_listen_fd``; both of torch's server
backends honour it). What goes through the store is either sealed with the job token (the state
schema, see :mod:`torchrelay.transfer.engine`) or consumed by gloo/NCCL's own rendezvous, which
is as trusted as the data plane itself.
"""

from __future__ import annotations

import datetime
import errno
import socket

import torch.distributed as dist


class RendezvousError(ValueError):
    """The rendezvous endpoint cannot be served here; the message says why, in one line."""


def bind_rendezvous(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: any free one), or :class:`RendezvousError`.

    Fails at once -- never waits -- for a port out of range or in use, a host that does not
    resolve, and a host that is not an address of this machine.
    """
    endpoint = f"{host}:{port}"
    if not 0 <= port <= 65535:
        raise RendezvousError(f"--rdzv-endpoint {endpoint}: port must be in 0..65535")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise RendezvousError(
            f"--rdzv-endpoint {endpoint}: cannot resolve {host!r} ({exc})"
        ) from None
    family, kind, proto, _, address = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        # A fixed port of a job that just ended may linger in TIME_WAIT; a live listener on it
        # still makes bind fail.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise RendezvousError(f"--rdzv-endpoint {endpoint}: {_why(exc, host)}") from None
    return sock


def _why(exc: OSError, host: str) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (pick another, or 0 for any free port on one node)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{host} is not an address of this machine (node 0 hosts the store: give one of "
            "its own addresses)"
        )
    if exc.errno == errno.EACCES:
        return "no permission to listen on this port (ports below 1024 need privileges)"
    return f"cannot listen there ({exc.strerror or exc})"


def address_towards(host: str) -> str:
    """This machine's address on its route to ``host`` (the rendezvous host): where a standby
    that takes the lead serves, so every node that reached the first leader reaches it too."""
    family, kind, proto, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.connect(address)  # UDP: picks the route, sends nothing
        return str(probe.getsockname()[0])


def serve_store(listener: socket.socket, timeout: datetime.timedelta) -> dist.TCPStore:
    """The job's store server on ``listener`` (from :func:`bind_rendezvous`), which it takes
    over: torch's server owns and closes the socket from here on."""
    host, port = listener.getsockname()[:2]
    fd = listener.detach()
    return dist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timeout,
        master_listen_fd=fd,
    )
