"""Bounded calls to etcd's v3 JSON gateway through ``etcd3gw``.

Every call has a timeout and every failure becomes one :class:`StoreUnavailable` line naming
the server and the operation: a stopped etcd (SIGSTOP, a partition: connections are accepted,
nothing answers) costs the caller at most the timeout, never a hang. ``etcd3gw``'s own watcher
has no read timeout, so :meth:`EtcdConnection.wait_deleted` streams the watch itself, bounded.

One connection is one ``requests`` session; the election's keepalive thread gets its own.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, TypeVar

import etcd3gw
import requests
from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.lease import Lease

from torchrelay.control.store.base import StoreUnavailable

DEFAULT_TIMEOUT = 2.0
"""Seconds an etcd call may take. A healthy etcd on a LAN answers in milliseconds; a commit
that waits on a slow disk may take tens."""

T = TypeVar("T")


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def equal(key: str, target: str, revision: int) -> dict[str, Any]:
    """A transaction compare: ``key``'s ``target`` revision (``MOD`` or ``CREATE``) equals
    ``revision`` (0 matches a missing key)."""
    field = {"MOD": "mod_revision", "CREATE": "create_revision"}[target]
    return {"key": b64(key), "result": "EQUAL", "target": target, field: revision}


class EtcdConnection:
    """A client for one etcd endpoint whose calls each take at most ``timeout`` seconds."""

    def __init__(self, host: str, port: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.where = f"etcd at {host}:{port}"
        self.timeout = timeout
        self._client = etcd3gw.client(host=host, port=port, timeout=timeout)

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, with any failure turned into one :class:`StoreUnavailable` line."""
        try:
            return fn(*args)
        except etcd_exceptions.ConnectionTimeoutError:
            reason = f"no answer within {self.timeout:g} s"
        except etcd_exceptions.ConnectionFailedError:
            reason = "cannot connect (is etcd running there, and is the address right?)"
        except (etcd_exceptions.Etcd3Exception, requests.RequestException) as exc:
            detail = getattr(exc, "detail_text", None) or str(exc) or type(exc).__name__
            reason = " ".join(str(detail).split())[:200]
        except (ValueError, KeyError) as exc:  # not etcd's gateway answering
            reason = f"unexpected answer ({type(exc).__name__}: {exc})"[:200]
        raise StoreUnavailable(f"{self.where}: {what} failed: {reason}")

    def close(self) -> None:
        self._client.session.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._client.post(self._client.get_url(path), json=body)

    def txn(
        self,
        what: str,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """One transaction; the answer as etcd gives it (``succeeded`` absent means false)."""
        body = {"compare": compare, "success": success, "failure": failure}
        return self.call(what, self._post, "/kv/txn", body)

    def get(self, what: str, key: str) -> dict[str, Any] | None:
        """The key's record (``value``, ``mod_revision``, ... as etcd gives them) or None."""
        answer = self.call(what, self._post, "/kv/range", {"key": b64(key)})
        kvs = answer.get("kvs") or []
        return kvs[0] if kvs else None

    def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: its id and the TTL etcd granted (never below etcd's minimum)."""

        def grant() -> tuple[int, int]:
            answer = self._post("/lease/grant", {"TTL": ttl})
            return int(answer["ID"]), int(answer["TTL"])

        return self.call("lease grant", grant)

    def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; the TTL it now has, or <= 0 when etcd no longer knows it."""
        return self.call("lease keepalive", Lease(lease, self._client).refresh)

    def revoke(self, lease: int) -> None:
        """Revoke ``lease``: etcd deletes every key attached to it."""
        self.call("lease revoke", Lease(lease, self._client).revoke)

    def wait_deleted(self, key: str, start_revision: int, timeout: float) -> bool:
        """Watch ``key`` from ``start_revision``; True once a delete event arrives.

        False when ``timeout`` seconds pass without any (the stream's read timeout), or when
        the watch fails in any way: the caller then re-reads the key with a bounded call,
        which reports a real outage.
        """
        create = {"key": b64(key), "start_revision": start_revision, "filters": ["NOPUT"]}
        url = self._client.get_url("/watch")
        try:
            with self._client.session.post(
                url,
                json={"create_request": create},
                stream=True,
                timeout=(self.timeout, max(timeout, 0.01)),
            ) as answer:
                pending = b""
                for chunk in answer.iter_content(chunk_size=None):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip() and json.loads(line).get("result", {}).get("events"):
                            return True
        except (requests.RequestException, etcd_exceptions.Etcd3Exception, ValueError):
            return False
        return False
