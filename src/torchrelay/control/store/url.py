"""``--state memory|etcd://HOST:PORT[/PREFIX]``: where a job keeps its durable state.

Parsing imports nothing heavy (the CLI validates flags before torch or a client loads);
:func:`open_backend` imports the etcd client only when it is asked for one.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from torchrelay.control.store.base import StateBackend, StoreError

_PREFIX = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
DEFAULT_PREFIX = "torchrelay"


class StoreKind(enum.Enum):
    MEMORY = "memory"
    ETCD = "etcd"


@dataclass(frozen=True)
class StoreSpec:
    """A parsed ``--state``: the backend kind, and for etcd its endpoint and key prefix."""

    kind: StoreKind = StoreKind.MEMORY
    host: str = ""
    port: int = 0
    prefix: str = DEFAULT_PREFIX

    def __str__(self) -> str:
        if self.kind is StoreKind.MEMORY:
            return "memory"
        return f"etcd://{self.host}:{self.port}/{self.prefix}"


def parse_store_url(text: str) -> StoreSpec:
    """Parse ``memory`` or ``etcd://HOST:PORT[/PREFIX]``; :class:`StoreError` names the fix."""
    if text == "memory":
        return StoreSpec()
    usage = f"--state must be 'memory' or 'etcd://HOST:PORT[/PREFIX]', not {text!r}"
    scheme, sep, rest = text.partition("://")
    if scheme != "etcd" or not sep:
        raise StoreError(usage)
    endpoint, _, prefix = rest.partition("/")
    host, _, port = endpoint.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:2379
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StoreError(f"{usage} (HOST:PORT with PORT in 1..65535)")
    prefix = prefix.strip("/") or DEFAULT_PREFIX
    if not _PREFIX.fullmatch(prefix):
        raise StoreError(f"{usage} (PREFIX: letters, digits, '.', '_', '-', '/')")
    return StoreSpec(StoreKind.ETCD, host, int(port), prefix)


def open_backend(spec: StoreSpec, timeout: float | None = None) -> StateBackend:
    """A backend for ``spec``; nothing is contacted yet (call ``check()`` to find out)."""
    if spec.kind is StoreKind.MEMORY:
        from torchrelay.control.store.memory import MemoryBackend

        return MemoryBackend()
    from torchrelay.control.store.etcd import EtcdBackend
    from torchrelay.control.store.etcd_client import DEFAULT_TIMEOUT

    return EtcdBackend(spec.host, spec.port, spec.prefix, timeout or DEFAULT_TIMEOUT)
