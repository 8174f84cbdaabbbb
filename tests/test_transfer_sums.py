"""Checksums a source computed while it halted are the ones its transfer sends: a state that
changed since is caught by the receiver, never delivered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.test_transfer_engine import _replica
from torchrelay.control.wire import new_token
from torchrelay.transfer.engine import TransferError, receive_state, send_state
from torchrelay.transfer.sums import ChunkSums, checksum, checksum_parts


def test_a_chunk_of_several_parts_hashes_as_their_concatenation():
    parts = [torch.arange(n, dtype=torch.uint8) for n in (0, 3, 70, 5)]
    assert checksum_parts(parts) == checksum(torch.cat(parts))


def _transfer(ranks, after_hashing: Callable[[dict[str, Any]], None]) -> Any:
    """Source rank 0 hashes its state at the halt, ``after_hashing(state)``, then sends."""
    store, token = dist.HashStore(), new_token()
    spare = _replica(seed=99, steps=0)[0]

    def body(rank: int, pg: dist.ProcessGroup) -> Any:
        if rank == 0:
            state = {"step": 3, "objects": _replica(seed=0, steps=3)[0].state()}
            ready = ChunkSums(state)
            assert ready.finished(timeout=30)
            assert ready.take()  # every chunk was hashed before the send
            after_hashing(state)
            return send_state(pg, store, token, 1, state, 0, [0], [1], ready=ready)
        own = {"step": -1, "objects": spare.state()}
        return receive_state(pg, store, token, 1, own, [0])

    return ranks(2, body)[1]


def test_the_halts_checksums_verify_and_the_state_arrives_exact(ranks):
    received = _transfer(ranks, lambda state: None)
    expected = _replica(seed=0, steps=3)[0].state()["model"]
    model = received.state["objects"]["model"]
    assert all(torch.equal(model[k], expected[k]) for k in expected)


def test_a_state_changed_after_hashing_fails_the_transfer(ranks):
    """The values from the halt are used as they are: bytes that changed since do not match."""

    def nudge(state: dict[str, Any]) -> None:
        state["objects"]["model"]["0.weight"][0, 0] += 1.0

    with pytest.raises(TransferError, match="failed its checksum"):
        _transfer(ranks, nudge)
