"""A connection to a pool (a job's launcher, ``torchrelay status --pool``).

Imports neither torch nor the controller. Every request is sealed with the pool token; a
refusal raises :class:`PoolError` with the pool's one-line message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from torchrelay.control.wire import WireError, seal, unseal

SERVICE = "torchrelay.Pool"


class PoolError(RuntimeError):
    """The pool refused a request or could not be reached (one line)."""


def read_token(path: Path) -> str:
    """The pool token from ``path``; ``SystemExit`` with one line if it is unusable."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"torchrelay: cannot read the pool token {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise SystemExit(f"torchrelay: the pool token in {path} is shorter than 16 characters")
    return token


class PoolClient:
    """Calls the pool at ``address`` as job ``job`` ("" for an operator)."""

    def __init__(self, address: str, token: str, job: str = "") -> None:
        self.address = address
        self.job = job
        self._token = token
        self._channel = grpc.insecure_channel(address)

    def call(self, method: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        stub = self._channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            answer = stub(seal({**body, "job": self.job}, self._token), timeout=timeout)
            return unseal(answer, self._token)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            detail = exc.details()  # type: ignore[attr-defined]
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                detail = f"the pool at {self.address} cannot be reached ({detail})"
            raise PoolError(detail) from None
        except WireError as exc:
            raise PoolError(f"the pool's answer failed authentication: {exc}") from None

    def close(self) -> None:
        self._channel.close()
