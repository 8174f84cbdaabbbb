"""Authenticated control messages: JSON bodies sealed with an HMAC of the job token.

Nothing received over the network is ever unpickled. A message is UTF-8 JSON of the form
``{"mac": <hex>, "body": {...}}`` where ``mac = HMAC-SHA256(token, canonical(body))``. A message
whose MAC does not verify (wrong job, tampering) or that is not well-formed raises
:class:`WireError` with a message that says which.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any


class WireError(ValueError):
    """A control message that is malformed or not authenticated for this job."""


def new_token() -> str:
    """A fresh random job token (256 bits, hex)."""
    return secrets.token_hex(32)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _mac(token: str, payload: bytes) -> str:
    return hmac.new(token.encode(), payload, hashlib.sha256).hexdigest()


def seal(body: dict[str, Any], token: str) -> bytes:
    """Serialize ``body`` and attach its MAC under ``token``."""
    payload = _canonical(body)
    return json.dumps({"mac": _mac(token, payload), "body": body}, separators=(",", ":")).encode()


def unseal(data: bytes, token: str) -> dict[str, Any]:
    """Parse and authenticate a sealed message; return its body or raise :class:`WireError`."""
    try:
        envelope = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"malformed control message (not JSON): {exc}") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("body"), dict):
        raise WireError("malformed control message: expected {'mac': ..., 'body': {...}}")
    mac = envelope.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(
        mac, _mac(token, _canonical(envelope["body"]))
    ):
        raise WireError(
            "control message failed authentication: wrong job token (is this process "
            "talking to another job's controller?)"
        )
    return envelope["body"]
