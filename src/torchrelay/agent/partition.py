"""The network-partition drill: cut this node off the network for a while, with nftables.

Every packet in or out of the node's non-loopback interfaces is dropped -- silently, as a
failed switch port or a cut cable does: peers see no reset, only silence. The interfaces sit in
an nftables set whose elements time out, so the kernel heals the cut by itself after the
requested seconds, even though every torchrelay process on the node is dead by then (as it
should be: an agent cut off from its controller kills its workers).

Needs the ``nft`` command (Debian/Ubuntu: ``apt install nftables``) and CAP_NET_ADMIN.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
from pathlib import Path

TABLE = "torchrelay_chaos"
_SETUP = f"""
add table inet {TABLE}
add set inet {TABLE} cut {{ type ifname; flags timeout; }}
add chain inet {TABLE} input {{ type filter hook input priority -150; policy accept; }}
add chain inet {TABLE} output {{ type filter hook output priority -150; policy accept; }}
flush chain inet {TABLE} input
flush chain inet {TABLE} output
add rule inet {TABLE} input iifname @cut drop
add rule inet {TABLE} output oifname @cut drop
"""


class PartitionError(RuntimeError):
    """The drill cannot run on this node; the message says what is missing."""


def interfaces() -> list[str]:
    """This node's network interfaces other than loopback."""
    return sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name != "lo")


def check_cuttable(controller: str) -> None:
    """Refuse a drill that could not cut anything: a node that reaches its controller over
    loopback shares the controller's host network, and no interface rule separates them."""
    host = controller.rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError) as exc:
        raise PartitionError(f"cannot resolve the controller host {host!r}: {exc}") from None
    if address.is_loopback:
        raise PartitionError(
            f"this node reaches the controller over loopback ({controller}): it shares the "
            "controller's host network, so no partition can separate them; run the nodes on "
            "separate hosts (or network namespaces)"
        )


def prepare() -> list[str]:
    """Install the (empty) cut table; return the interfaces :func:`cut` would drop."""
    if shutil.which("nft") is None:
        raise PartitionError(
            "the partition drill needs nftables' `nft` command on the node "
            "(e.g. apt install nftables) and CAP_NET_ADMIN"
        )
    names = interfaces()
    if not names:
        raise PartitionError("this node has no network interface but loopback: nothing to cut")
    _nft(_SETUP)
    return names


def cut(names: list[str], seconds: float) -> None:
    """Drop all traffic on ``names`` for ``seconds``; the kernel lifts it afterwards."""
    timeout = f"{max(1, round(seconds * 1000))}ms"
    elements = ", ".join(f'"{name}" timeout {timeout}' for name in names)
    _nft(f"add element inet {TABLE} cut {{ {elements} }}\n")


def _nft(script: str) -> None:
    done = subprocess.run(
        ["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise PartitionError(f"nft refused the rules (CAP_NET_ADMIN?): {done.stderr.strip()}")
