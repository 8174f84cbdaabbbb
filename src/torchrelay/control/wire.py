"""Authenticated control messages: JSON bodies sealed with an HMAC of the job token.

Nothing received over the network is ever unpickled, and nothing is parsed before it is
authenticated. A message is ``<mac>.<payload>``: ``payload`` is UTF-8 JSON
``{"body": {...}, "nonce": <hex>, "sent": <unix seconds>}`` and ``mac`` is the 64 hex digits of
``HMAC-SHA256(token, payload)``, computed over the payload's exact bytes. :func:`open_sealed`
checks the size bound, then the MAC (constant time), and only then parses the JSON, so a forged
message costs one HMAC and can never reach the parser (no deeply nested JSON exploding the
stack before authentication). Every failure raises :class:`WireError` with a one-line message
and a ``reason`` (``malformed`` or ``unauthenticated``) that callers count by.

The nonce (128 random bits) and the sender's clock let the receiver refuse a replayed or stale
message (see :mod:`torchrelay.control.replay`); :func:`unseal` alone does not: data that is
meant to be read many times (the state schema in the store) uses it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

# Far above any control message (a plan for thousands of ranks, a traceback, a state schema),
# and far below what would hurt the receiver's memory.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_MAC_HEX = 64  # SHA-256


class WireError(ValueError):
    """A control message that is malformed or not authenticated for this job.

    ``reason`` names the kind of refusal for counting: ``malformed`` (not a sealed message, too
    large, or a body that is not the expected JSON) or ``unauthenticated`` (wrong job token or
    tampered bytes); :mod:`torchrelay.control.replay` adds ``replayed`` and ``stale``.
    """

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Sealed:
    """An authenticated message: its body, its nonce and its sender's send time."""

    body: dict[str, Any]
    nonce: str
    sent: float


def new_token() -> str:
    """A fresh random job token (256 bits, hex)."""
    return secrets.token_hex(32)


def _mac(token: str, payload: bytes) -> bytes:
    return hmac.new(token.encode(), payload, hashlib.sha256).hexdigest().encode()


def seal(body: dict[str, Any], token: str) -> bytes:
    """Serialize ``body`` with a fresh nonce and the current time, and prefix their MAC."""
    envelope = {"body": body, "nonce": secrets.token_hex(16), "sent": time.time()}
    payload = json.dumps(envelope, separators=(",", ":")).encode()
    return _mac(token, payload) + b"." + payload


def open_sealed(data: bytes, token: str) -> Sealed:
    """Authenticate, then parse a sealed message; raise :class:`WireError` if either fails."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(
            f"malformed control message: {len(data)} bytes, more than {MAX_MESSAGE_BYTES}"
        )
    data = bytes(data)
    mac, dot, payload = data[:_MAC_HEX], data[_MAC_HEX : _MAC_HEX + 1], data[_MAC_HEX + 1 :]
    if dot != b"." or len(mac) != _MAC_HEX:
        raise WireError("malformed control message: expected <64 hex digits of MAC>.<payload>")
    if not hmac.compare_digest(mac, _mac(token, payload)):
        raise WireError(
            "control message failed authentication: wrong job token (is this process "
            "talking to another job's controller?)",
            reason="unauthenticated",
        )
    try:
        envelope = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # Only a holder of the token gets here; still, a bad body is an error, not a crash.
        raise WireError(f"malformed control message body: {type(exc).__name__}") from None
    if (
        not isinstance(envelope, dict)
        or not isinstance(envelope.get("body"), dict)
        or not isinstance(envelope.get("nonce"), str)
        or not isinstance(envelope.get("sent"), (int, float))
    ):
        raise WireError("malformed control message: expected {'body', 'nonce', 'sent'}")
    return Sealed(envelope["body"], envelope["nonce"], float(envelope["sent"]))


def unseal(data: bytes, token: str) -> dict[str, Any]:
    """The body of a sealed message (authenticated, but not checked for replay)."""
    return open_sealed(data, token).body
