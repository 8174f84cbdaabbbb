"""Nothing a receiver acts on comes unauthenticated: a forged schema or checksum list is a
failed transfer (TransferError, which the runtime reports as such), never another exception."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from torchrelay.control.wire import new_token, seal
from torchrelay.transfer import engine
from torchrelay.transfer.engine import TransferError, receive_state, schema_key, send_state


def _state() -> dict[str, Any]:
    return {"step": 3, "objects": {"w": torch.arange(64, dtype=torch.float32)}}


def _receive_with_schema(ranks, raw: bytes, token: str, generation: int = 2) -> None:
    store = dist.HashStore()
    store.set(schema_key(generation), raw)

    def body(_rank: int, pg: dist.ProcessGroup) -> None:
        receive_state(pg, store, token, generation, _state(), sources=[1])

    ranks(1, body)


def _authentic_schema(ranks, token: str, generation: int) -> bytes:
    """The schema a real source publishes for ``generation``."""
    store = dist.HashStore()

    def body(rank: int, pg: dist.ProcessGroup) -> None:
        if rank == 0:
            send_state(pg, store, token, generation, _state(), 0, [0], [1])
        else:
            receive_state(pg, store, token, generation, _state(), [0])

    ranks(2, body)
    return store.get(schema_key(generation))


@pytest.mark.parametrize(
    "forge, message",
    [
        (lambda ranks, token: b"garbage", "malformed control message"),
        (lambda ranks, token: b"0" * 64 + b'.{"body": {"tree": 1}}', "failed authentication"),
        (lambda ranks, token: seal({"generation": 2}, new_token()), "failed authentication"),
        (lambda ranks, token: seal({"generation": 2, "tree": {}}, token), "specs"),
        (lambda ranks, token: _authentic_schema(ranks, token, generation=1), "for generation 1"),
    ],
    ids=["garbage", "bad-mac", "other-job", "authentic-but-malformed", "replayed-generation"],
)
def test_forged_schema_is_a_failed_transfer(ranks, forge, message):
    token = new_token()
    with pytest.raises(TransferError, match=message):
        _receive_with_schema(ranks, forge(ranks, token), token)


class _OnTheWire:
    """A process group through which an attacker alters the first chunk a source sends and
    rewrites that chunk's checksum to match -- as anyone on the data network could."""

    def __init__(self, pg: dist.ProcessGroup) -> None:
        self._pg = pg
        self._forged: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pg, name)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        tensor = tensors[0]
        if tensor.dtype == torch.uint8 and self._forged is None:
            tensor = tensor.clone()
            tensor[0] ^= 0xFF
            self._forged = engine._checksum(tensor)
        elif tensor.dtype == torch.int64:
            tensor = tensor.clone()
            tensor[0] = self._forged
        return self._pg.send([tensor], dst, tag)


def test_checksums_rewritten_on_the_wire_are_detected(ranks):
    store, token = dist.HashStore(), new_token()

    def body(rank: int, pg: dist.ProcessGroup) -> Any:
        if rank == 0:
            return send_state(_OnTheWire(pg), store, token, 1, _state(), 0, [0], [1], 64)
        return receive_state(pg, store, token, 1, _state(), [0])

    with pytest.raises(TransferError, match="checksum list from source rank 0 failed auth"):
        ranks(2, body)


def test_untampered_transfer_still_verifies(ranks):
    store, token = dist.HashStore(), new_token()
    sent = {"step": 5, "objects": {"w": torch.randn(300)}}

    def body(rank: int, pg: dist.ProcessGroup) -> Any:
        if rank == 0:
            return send_state(pg, store, token, 1, sent, 0, [0], [1], 64)
        return receive_state(pg, store, token, 1, _state(), [0])

    result = ranks(2, body)[1]
    assert result.state["step"] == 5
    assert torch.equal(result.state["objects"]["w"], sent["objects"]["w"])
