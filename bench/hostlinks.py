"""Emulated hosts on one machine: a network namespace per source, each behind its own capped link.

On one 2-core host every source of a transfer shares the receiver's socket copy and the same
cores, so adding sources cannot show what striping buys on a cluster, where each source's
network link is the bound. :class:`HostLinks` rebuilds that bound: source ``k`` runs in the
namespace ``<prefix>s<k>``, whose only interface (``NIC``, the same name in every namespace) is
one end of a veth pair; the other end joins a bridge in the root namespace, where the receiver
runs. A ``tbf`` queue on each source's interface caps what that source can send at ``mbit``
Mbit/s, as one NIC per host would; the receiver's side is not capped.

Needs root and ``ip``/``tc`` (iproute2). Leaving the ``with`` block deletes every veth pair,
namespace and the bridge, on an exception too. A run killed with SIGKILL leaves
them: ``ip netns list`` shows them, ``ip netns del`` removes them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from types import TracebackType

NIC = "trnic"  # the source's interface inside its namespace
SUBNET = "10.77"  # 10.77.<run>.0/24: the bridge is .1, source k is .(10 + k)
# A namespace outlives `ip netns del` while a process of it is still being reaped, with its
# veth: every HostLinks of a process gets names of its own.
_SERIAL = itertools.count()


class HostLinksError(RuntimeError):
    """The emulated hosts could not be set up (not root, no iproute2, no netns support)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise HostLinksError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


class HostLinks:
    """``count`` emulated source hosts, each sending through its own ``mbit`` Mbit/s link."""

    def __init__(self, count: int, mbit: float) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            raise HostLinksError("emulated hosts need root and iproute2 (`ip`, `tc`)")
        self.count, self.mbit = count, mbit
        tag = (os.getpid() % 1000) * 10 + next(_SERIAL) % 10
        self._prefix = f"tr{tag}"
        self.bridge = f"{self._prefix}br"  # the receiver's interface (root namespace)
        self._net = f"{SUBNET}.{tag % 250}"
        self._made: list[str] = []

    def namespace(self, source: int) -> str:
        return f"{self._prefix}s{source}"

    def address(self, source: int) -> str:
        return f"{self._net}.{10 + source}"

    @property
    def receiver_address(self) -> str:
        return f"{self._net}.1"

    def prefix(self, source: int) -> list[str]:
        """The command prefix that runs a program on source ``source``'s emulated host."""
        return ["ip", "netns", "exec", self.namespace(source)]

    def __enter__(self) -> HostLinks:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(self.bridge)
            _ip("addr", "add", f"{self.receiver_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for k in range(self.count):
                self._add_host(k)
        except BaseException:
            self._remove()
            raise
        return self

    def _add_host(self, k: int) -> None:
        ns, outside = self.namespace(k), f"{self._prefix}v{k}"
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", NIC, "netns", ns)
        self._made.append(outside)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", NIC)
        _ip("-n", ns, "link", "set", NIC, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        # burst: a few ms of the rate (tbf needs at least one MTU); latency bounds the queue.
        burst = max(16_000, int(self.mbit * 1e6 / 8 * 0.004))
        rate = ["rate", f"{self.mbit}mbit", "burst", str(burst), "latency", "50ms"]
        done = subprocess.run(
            ["tc", "-n", ns, "qdisc", "add", "dev", NIC, "root", "tbf", *rate],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise HostLinksError(f"capping {ns}'s link failed: {done.stderr.strip()}")

    def _remove(self) -> None:
        for name in reversed(self._made):  # each veth pair before its namespace
            if name.startswith(self._prefix + "s"):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self._made.clear()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._remove()
