"""State moves from live replicas to a fresh process: exact, striped, in place, verified."""

import threading

import pytest
import torch
import torch.distributed as dist

from torchrelay.control.wire import new_token
from torchrelay.runtime.tracked import TrackedState
from torchrelay.transfer import engine
from torchrelay.transfer.engine import TransferError, receive_state, send_state
from torchrelay.transfer.flatten import flatten

_RNG_LOCK = threading.Lock()  # rank threads share torch's global RNG


def _replica(seed: int, steps: int):
    with _RNG_LOCK:
        return _build_replica(seed, steps)


def _build_replica(seed: int, steps: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    torch.manual_seed(100)
    for _ in range(steps):
        model(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    tracked = TrackedState()
    for name, obj in (("model", model), ("optimizer", opt), ("scheduler", sched)):
        tracked.add(name, obj)
    return tracked, model, opt, sched


def _from_two_sources(ranks, receive):
    """Ranks 0 and 1 send the state after 3 steps to rank 2 in chunks of 256 bytes; rank 2 runs
    ``receive(pg, store, token, sources)``; every rank's result."""
    store, token = dist.HashStore(), new_token()
    sources, receivers = [0, 1], [2]

    def body(rank, pg):
        if rank in sources:
            tracked, *_ = _replica(seed=0, steps=3)
            state = {"step": 3, "objects": tracked.state()}
            return send_state(pg, store, token, 1, state, rank, sources, receivers, 256)
        return receive(pg, store, token, sources)

    return ranks(3, body)


def _transfer(ranks, progress=None):
    def receive(pg, store, token, sources):
        tracked, model, opt, sched = _replica(seed=99, steps=0)
        own = tracked.state()
        weight = model[0].weight
        own_state = {"step": -1, "objects": own}
        result = receive_state(pg, store, token, 1, own_state, sources, progress=progress)
        tracked.load(result.state["objects"], own)
        return result, tracked, model, opt, sched, weight

    return _from_two_sources(ranks, receive)


def test_fresh_receiver_gets_the_exact_state_in_place(ranks):
    *sent, (result, _, model, opt, sched, weight) = _transfer(ranks)
    _reference, ref_model, ref_opt, ref_sched = _replica(seed=0, steps=3)
    assert result.state["step"] == 3
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert model[0].weight is weight  # parameters were received in place
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], ref_opt.state[q][key])
    assert sched.state_dict() == ref_sched.state_dict()
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    both = [s.bytes for s in sent]
    assert all(b > 0 for b in both) and sum(both) == result.bytes  # striped over both sources


def test_the_receiver_reports_progress_chunk_by_chunk(ranks):
    totals: list[int] = []
    landed: list[int] = []

    def progress(total: int):
        totals.append(total)
        return landed.append

    *_, (result, *_rest) = _transfer(ranks, progress=progress)
    assert totals == [result.bytes]  # made once, with the size to come
    assert sum(landed) == result.bytes and len(landed) > 2 and max(landed) <= 256


def test_corrupted_chunk_is_detected(ranks, monkeypatch):
    real = engine._checksum
    calls = {"n": 0}

    def flaky(piece):
        calls["n"] += 1
        value = real(piece)
        return value ^ 1 if calls["n"] == 5 else value

    monkeypatch.setattr(engine, "_checksum", flaky)
    with pytest.raises(TransferError, match="checksum"):
        _transfer(ranks)


def test_the_sidecar_comes_from_the_lowest_source_only(ranks):
    """Sources may hold different rank-local tables (one exchange apart); a receiver must get
    one source's, whole, never a mix."""
    store, token = dist.HashStore(), new_token()
    sources, receivers = [0, 1], [2]

    def body(rank, pg):
        tracked, *_ = _replica(seed=0, steps=1)
        state = {"step": 1, "objects": tracked.state()}
        if rank in sources:
            sidecar = {"step": 1 - rank, "ranks": {"0": "x" * (rank + 1)}}
            send_state(pg, store, token, 1, state, rank, sources, receivers, 256, sidecar=sidecar)
            return None
        return receive_state(pg, store, token, 1, state, sources).sidecar

    assert ranks(3, body)[2] == {"step": 1, "ranks": {"0": "x"}}


def _laggard_receives(ranks, keep_own: bool, corrupt: bool):
    """A laggard (state one step behind, optimizer state present) receives from two sources;
    returns (its state's bytes before, after, whether the transfer failed, its model)."""

    def receive(pg, store, token, sources):
        receiving.on = True
        tracked, model, *_ = _replica(seed=0, steps=2)
        own = tracked.state()
        before = [t.clone() for t in flatten(own)[1]]
        mine = {"step": 2, "objects": own}
        try:
            result = receive_state(pg, store, token, 1, mine, sources, keep_own=keep_own)
        except TransferError:
            return before, [t.clone() for t in flatten(own)[1]], True, model
        tracked.load(result.state["objects"], own)
        return before, [t.clone() for t in flatten(tracked.state())[1]], False, model

    receiving, real = threading.local(), engine._checksum

    def flaky(piece):
        # The receiver's sum of its first chunk is off: verification fails once all landed.
        value = real(piece)
        if corrupt and getattr(receiving, "on", False):
            receiving.on = False
            return value ^ 1
        return value

    engine._checksum = flaky
    try:
        return _from_two_sources(ranks, receive)[2]
    finally:
        engine._checksum = real


def test_a_receiver_that_keeps_its_state_loses_nothing_when_the_transfer_fails(ranks):
    """A laggard's state is still a valid source after a failed transfer: not one byte of it
    changed, whereas receiving in place leaves it half-overwritten."""
    kept_before, kept_after, kept_failed, _ = _laggard_receives(ranks, True, corrupt=True)
    assert kept_failed
    assert all(torch.equal(a, b) for a, b in zip(kept_before, kept_after, strict=True))
    before, after, failed, _ = _laggard_receives(ranks, False, corrupt=True)
    assert failed
    assert not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_receiver_that_keeps_its_state_loads_the_exact_state_once_verified(ranks):
    before, after, failed, model = _laggard_receives(ranks, True, corrupt=False)
    reference, ref_model, *_ = _replica(seed=0, steps=3)
    assert not failed
    expected = flatten(reference.state())[1]
    assert all(torch.equal(a, b) for a, b in zip(after, expected, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(a, b)
