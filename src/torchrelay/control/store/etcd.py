"""The etcd v3 backend: the job's state under ``/<prefix>/state``, its leader under
``/<prefix>/leader``, records it publishes (the control endpoint) under ``/<prefix>/records/``.

A write is one transaction: compare the state key's ``mod_revision`` with the revision the
writer read (0: no key yet), and, when fenced, the leader key's ``create_revision`` with the
writer's term; put only if both hold, else read back what is there. So two controllers can
never both write, and a deposed one never writes at all. The revision token is etcd's
``mod_revision`` of the state key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrelay.control.store.base import (
    Leadership,
    NotLeader,
    Revision,
    StateBackend,
)
from torchrelay.control.store.election import campaign
from torchrelay.control.store.etcd_client import (
    DEFAULT_TIMEOUT,
    EtcdConnection,
    b64,
    equal,
    unb64,
)


class EtcdBackend(StateBackend):
    """State and leader election in an etcd v3 cluster reached at ``host:port``."""

    def __init__(
        self, host: str, port: int, prefix: str = "torchrelay", timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._host, self._port, self._timeout = host, port, timeout
        self._conn = EtcdConnection(host, port, timeout)
        self.where = self._conn.where
        self._prefix = f"/{prefix}"
        self.state_key = f"/{prefix}/state"
        self.leader_key = f"/{prefix}/leader"

    def get_state(self) -> tuple[bytes | None, Revision]:
        kv = self._conn.get("read state", self.state_key)
        return _value(kv)

    def set_state(
        self, state: bytes, revision: Revision, fence: Leadership | None = None
    ) -> tuple[bytes | None, Revision, bool]:
        compare = [equal(self.state_key, "MOD", revision)]
        failure = [{"request_range": {"key": b64(self.state_key)}}]
        if fence is not None:
            compare.append(equal(self.leader_key, "CREATE", fence.revision))
            failure.append({"request_range": {"key": b64(self.leader_key)}})
        success = [{"request_put": {"key": b64(self.state_key), "value": b64(state)}}]
        answer = self._conn.txn("write state", compare, success, failure)
        if answer.get("succeeded"):
            return bytes(state), int(answer["header"]["revision"]), True
        ranges = [r["response_range"].get("kvs") or [None] for r in answer["responses"]]
        if fence is not None:
            leader = ranges[1][0]
            if leader is None or int(leader["create_revision"]) != fence.revision:
                raise NotLeader(
                    f"{self.where}: {fence.candidate!r} no longer leads (its term "
                    f"{fence.revision} ended): state not written"
                )
        return (*_value(ranges[0][0]), False)

    def campaign(
        self,
        candidate: str,
        ttl: int,
        timeout: float | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> Leadership:
        return campaign(self._connect, self.leader_key, candidate, ttl, timeout, on_lost)

    def publish(self, name: str, value: bytes, fence: Leadership) -> None:
        key = self._record_key(name)
        compare = [equal(self.leader_key, "CREATE", fence.revision)]
        success = [{"request_put": {"key": b64(key), "value": b64(value)}}]
        if not self._conn.txn(f"publish {name}", compare, success, []).get("succeeded"):
            raise NotLeader(
                f"{self.where}: {fence.candidate!r} no longer leads: {name} not published"
            )

    def lookup(self, name: str) -> bytes | None:
        return _value(self._conn.get(f"read {name}", self._record_key(name)))[0]

    def _record_key(self, name: str) -> str:
        return f"{self._prefix}/records/{name}"

    def check(self) -> None:
        self._conn.get("read state", self.state_key)

    def close(self) -> None:
        self._conn.close()

    def _connect(self, timeout: float | None = None) -> EtcdConnection:
        return EtcdConnection(self._host, self._port, timeout or self._timeout)


def _value(kv: dict[str, Any] | None) -> tuple[bytes | None, Revision]:
    if kv is None:
        return None, 0
    return unb64(kv.get("value", "")), int(kv["mod_revision"])
