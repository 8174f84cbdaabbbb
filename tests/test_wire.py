"""Control messages are authenticated per job and never executed."""

import hashlib
import hmac
import time

import pytest

from torchrelay.control.wire import (
    MAX_MESSAGE_BYTES,
    WireError,
    new_token,
    open_sealed,
    seal,
    unseal,
)


def test_sealed_message_round_trips():
    token = new_token()
    body = {"kind": "progress", "step": 3, "nested": {"a": [1, 2.5, None]}}
    assert unseal(seal(body, token), token) == body


def test_wrong_job_token_is_refused():
    with pytest.raises(WireError, match="wrong job token"):
        unseal(seal({"kind": "progress"}, new_token()), new_token())


def test_tampered_body_is_refused():
    token = new_token()
    data = seal({"kind": "progress", "step": 3}, token).replace(b'"step":3', b'"step":4')
    with pytest.raises(WireError, match="authentication"):
        unseal(data, token)


@pytest.mark.parametrize("data", [b"\x80\x04pickle", b"[]", b'{"mac": "x"}', b"not json"])
def test_malformed_bytes_are_refused(data):
    with pytest.raises(WireError, match="malformed"):
        unseal(data, new_token())


def _forge(payload: bytes, token: str) -> bytes:
    """A message framed like :func:`seal` around arbitrary payload bytes."""
    return hmac.new(token.encode(), payload, hashlib.sha256).hexdigest().encode() + b"." + payload


def test_deeply_nested_json_is_refused_before_it_is_parsed():
    # Unauthenticated: refused by the MAC without ever reaching the JSON parser.
    for data in (b"[" * 200_000, b'{"mac":"x","body":' + b"[" * 200_000):
        with pytest.raises(WireError) as err:
            unseal(data, new_token())
        assert err.value.reason in ("malformed", "unauthenticated")
    # Authenticated (only a token holder can do this): a WireError, never a RecursionError.
    token = new_token()
    with pytest.raises(WireError, match="malformed") as err:
        unseal(_forge(b'{"body":' + b"[" * 200_000 + b"]" * 200_000 + b"}", token), token)
    assert err.value.reason == "malformed"


def test_forged_payload_is_unauthenticated():
    token = new_token()
    forged = new_token().encode()[:64] + b"." + b'{"body":{},"nonce":"00","sent":0}'
    with pytest.raises(WireError, match="wrong job token") as err:
        unseal(forged, token)
    assert err.value.reason == "unauthenticated"


def test_authenticated_but_misshapen_payloads_are_malformed():
    token = new_token()
    for payload in (b"[]", b'{"body":[]}', b'{"body":{},"nonce":1,"sent":0}', b"\xff"):
        with pytest.raises(WireError, match="malformed"):
            unseal(_forge(payload, token), token)


def test_oversized_message_is_refused_unread():
    data = b"0" * 64 + b"." + b" " * MAX_MESSAGE_BYTES
    with pytest.raises(WireError, match="more than"):
        unseal(data, new_token())


def test_every_seal_carries_a_fresh_nonce_and_the_send_time():
    token = new_token()
    before = time.time()
    first, second = (open_sealed(seal({"kind": "x"}, token), token) for _ in range(2))
    assert first.body == second.body == {"kind": "x"}
    assert first.nonce != second.nonce and len(first.nonce) == 32
    assert before <= first.sent <= second.sent <= time.time()
