"""Control messages are authenticated per job and never executed."""

import pytest

from torchrelay.control.wire import WireError, new_token, seal, unseal


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
