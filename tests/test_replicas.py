"""Replicated vs rank-local state: serialization, the digest agreement check and the local
mirror, with real gloo groups between threads (the facade's poisoning is tested elsewhere)."""

from __future__ import annotations

import base64

import pytest
import torch

from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard
from torchrelay.runtime.replicas import (
    BLOCK_WORDS,
    AgreementCheck,
    LocalMirror,
    all_gather_bytes,
    block_sums,
    decode,
    describe,
    digest,
    disagreements,
    encode,
)
from torchrelay.runtime.tracked import TrackingError
from torchrelay.transfer.flatten import SchemaError

CPU = torch.device("cpu")


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return type(a) is type(b) and a == b


def test_encode_decode_round_trips_exactly():
    state = {
        "loss_sum": 0.1 + 0.2,
        "count": 7,
        3: ("a", None, True),
        "t": torch.randn(3, 2, dtype=torch.float64),
        "scalar": torch.tensor(5, dtype=torch.int32),
        "empty": torch.empty(0, 4),
        "nested": [{"x": torch.arange(4, dtype=torch.bfloat16)}],
    }
    assert _equal(decode(encode(state)), state)


def test_encode_refuses_what_would_need_pickle():
    with pytest.raises(SchemaError, match="cannot transfer a set"):
        encode({"seen": {1, 2}})


def test_decode_refuses_truncated_bytes():
    data = encode({"t": torch.ones(4)})
    with pytest.raises(ValueError, match="truncated"):
        decode(data[:-1])
    with pytest.raises(ValueError, match="trailing"):
        decode(data + b"x")


def test_digest_tells_equal_from_different_state():
    a = {"w": torch.ones(3), "n": 1}
    assert digest(a) == digest({"w": torch.ones(3), "n": 1})
    assert digest(a) != digest({"w": torch.ones(3), "n": 2})
    assert digest(a) != digest({"w": torch.tensor([1.0, 1.0, 1.0 + 2**-20]), "n": 1})
    assert digest(a) != digest({"w": torch.ones(3, dtype=torch.float64), "n": 1})


def test_disagreements_groups_ranks_by_value():
    rows = [[1, 10], [1, 11], [1, 10], [1, 12]]
    assert disagreements(["model", "counter"], rows) == {"counter": [[0, 2], [1], [3]]}
    line = describe({"counter": [[0, 2], [1], [3]]}, step=4)
    assert "'counter' (ranks [0, 2] | [1] | [3])" in line and "relay.track(local=" in line


class Counter:
    def __init__(self, value: float) -> None:
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def test_agreement_check_names_the_object_that_differs(ranks):
    def body(rank, pg):
        check = AgreementCheck()
        states = {"model": {"w": torch.ones(2)}, "counter": Counter(float(rank)).state_dict()}
        first = check.run(pg, CPU, states, step=0, complete=lambda: True)
        again = check.run(pg, CPU, states, step=1, complete=lambda: True)
        return first, again

    for first, again in ranks(3, body):
        assert first == {"counter": [[0], [1], [2]]}
        assert again == {}  # reported once


def test_agreement_check_is_due_after_the_jobs_first_two_commits_and_a_plans_second():
    check = AgreementCheck()
    assert [check.due(generation=0) for _ in range(4)] == [True, True, False, False]
    # A recovery's generation: its first commit ends the recomputed step (the stall), and the
    # transfer has verified every byte; one check, at the second.
    check.planned(1)
    assert [check.due(generation=1) for _ in range(3)] == [False, True, False]
    # A generation no plan started (the first one a process binds) is checked from its start.
    assert [check.due(generation=2) for _ in range(2)] == [True, True]


def test_agreement_check_refuses_ranks_at_different_steps(ranks):
    def body(rank, pg):
        with pytest.raises(RuntimeError, match="same start_step"):
            AgreementCheck().run(pg, CPU, {"m": {}}, step=rank, complete=lambda: True)

    ranks(2, body)


def test_agreement_check_is_inconclusive_when_the_collective_failed(ranks):
    def body(rank, pg):
        return AgreementCheck().run(pg, CPU, {"c": {"v": rank}}, step=0, complete=lambda: False)

    assert ranks(2, body) == [None, None]


def test_all_gather_bytes_of_different_lengths_grows_its_capacity_together(ranks):
    payloads = [b"", b"x" * 5, bytes(range(256)) * 3]

    def body(rank, pg):
        first = all_gather_bytes(pg, payloads[rank], CPU)
        smaller = all_gather_bytes(pg, payloads[rank][:3], CPU, capacity=first[1])
        return first, smaller

    for first, smaller in ranks(3, body):
        assert first == (payloads, 1024)
        assert smaller == ([p[:3] for p in payloads], 1024)


def test_local_mirror_hands_each_slot_its_own_state(ranks):
    """Every rank mirrors its local state; a replacement of slot 1 gets slot 1's value."""

    def body(rank, pg):
        stats = {"loss_sum": 0.0}
        mirror = LocalMirror(stats)
        for step in range(3):
            stats["loss_sum"] += (rank + 1) * 0.1
            mirror.exchange(pg, CPU, step, generation=0)
            mirror.commit(True)
        return mirror.for_transfer(), stats["loss_sum"]

    results = ranks(3, body)
    sent, _ = results[0]
    replacement = {"loss_sum": -1.0}
    assert LocalMirror(replacement).receive(sent, slot=1, target=2) is None
    assert replacement == {"loss_sum": results[1][1]}  # bit for bit: floats go as JSON repr


def _facade(pg, rank, world):
    guard = StepGuard()
    facade = StableProcessGroup(world, guard)
    facade.bind(pg, rank, generation=0)
    guard.enter_generation(0)
    return facade, guard


def test_an_abort_after_a_complete_exchange_keeps_it(ranks):
    """The race seen under load: the controller's abort lands after the all-gather completed
    and before the step's commit. The step commits (the optimizer ran) and so must the table,
    or a replacement gets its local state a step behind its weights."""

    def body(rank, pg):
        facade, guard = _facade(pg, rank, 2)
        counter = Counter(float(rank))
        mirror = LocalMirror(counter)
        guard.begin_step()
        completed = mirror.exchange(facade, CPU, 0, generation=0)
        guard.abort(0)
        assert guard.poisoned
        mirror.commit(True)
        return completed, mirror.for_transfer()

    for completed, sent in ranks(2, body):
        assert completed and sent["step"] == 0
        replacement = Counter(-1.0)
        assert LocalMirror(replacement).receive(sent, slot=1, target=0) is None
        assert replacement.value == 1.0


def test_local_mirror_keeps_the_last_complete_exchange_and_says_when_it_is_stale(ranks):
    def body(rank, pg):
        facade, guard = _facade(pg, rank, 2)
        counter = Counter(float(rank))
        mirror = LocalMirror(counter)
        guard.begin_step()
        assert mirror.exchange(facade, CPU, 0, generation=0)
        mirror.commit(True)
        counter.value += 10
        guard.begin_step()
        guard.poison("a collective after the optimizer step failed")
        assert not mirror.exchange(facade, CPU, 1, generation=0)
        mirror.commit(True)  # the step still commits: the optimizer had run
        return mirror.for_transfer()

    sent = ranks(2, body)[0]
    replacement = Counter(-1.0)
    warning = LocalMirror(replacement).receive(sent, slot=1, target=1)
    assert replacement.value == 1.0
    assert warning is not None and "from step 0, the model from step 1" in warning


def test_a_dropped_step_never_becomes_the_table(ranks):
    def body(rank, pg):
        mirror = LocalMirror({"n": rank})
        assert mirror.exchange(pg, CPU, 0, generation=0)
        mirror.commit(False)
        return mirror.for_transfer()

    assert ranks(2, body)[0] == {"step": -1, "ranks": {}}


def test_a_malformed_table_is_a_warning_not_a_crash():
    mirror = LocalMirror({"n": 0})
    warning = mirror.receive({"step": 2, "ranks": {"1": "not base64!"}}, slot=1, target=2)
    assert warning is not None and "malformed" in warning and mirror.obj == {"n": 0}


def test_local_mirror_before_any_commit_keeps_the_initial_state():
    mirror = LocalMirror({"n": 0})
    assert mirror.receive({"step": -1, "ranks": {}}, slot=0, target=-1) is None
    assert "restarts from its initial value" in mirror.receive(
        {"step": -1, "ranks": {}}, slot=0, target=3
    )


def test_local_mirror_snapshot_restores_a_dropped_step():
    stats = {"n": 1, "t": torch.zeros(2)}
    mirror = LocalMirror(stats)
    snap = mirror.snapshot()
    stats["n"] += 1
    stats["t"] += 1
    mirror.restore(snap)
    assert stats["n"] == 1 and torch.equal(stats["t"], torch.zeros(2))


def test_local_state_needs_state_dict_or_a_dict():
    with pytest.raises(TrackingError, match="local=list"):
        LocalMirror([1, 2])


def test_a_replacements_mirror_matches_the_survivors_in_the_next_generation(ranks):
    """Buffer sizes must agree: a fresh mirror (a replacement) and a grown one (a survivor)."""

    def body(rank, pg):
        mirror = LocalMirror({"v": "x" * 100 * (rank + 1)})
        mirror.exchange(pg, CPU, 0, generation=0)
        mirror.commit(True)
        if rank == 1:
            mirror = LocalMirror({"v": "y"})  # the replacement of slot 1
        mirror.exchange(pg, CPU, 1, generation=1)
        mirror.commit(True)
        return mirror.for_transfer()

    for sent in ranks(2, body, timeout=10):
        assert sent["step"] == 1
        assert [decode(base64.b64decode(sent["ranks"][r])) for r in "01"] == [
            {"v": "x" * 100},
            {"v": "y"},
        ]


def test_block_sums_change_with_any_word_and_with_blocks_moved():
    words = BLOCK_WORDS * 3
    base = torch.arange(words + 3, dtype=torch.int32).view(torch.uint8)[: 4 * words + 7]
    sums = block_sums(base)
    assert sums.dtype == torch.int64 and sums.numel() == 3 + 7  # 3 blocks, 7 trailing bytes
    assert torch.equal(sums, block_sums(base.clone()))
    for index in (0, 4 * BLOCK_WORDS + 5, base.numel() - 1):  # a block's word, a trailing byte
        changed = base.clone()
        changed[index] ^= 1
        assert not torch.equal(block_sums(changed), sums)
    moved = base.clone().view(-1)
    moved[: 4 * BLOCK_WORDS], moved[4 * BLOCK_WORDS : 8 * BLOCK_WORDS] = (
        base[4 * BLOCK_WORDS : 8 * BLOCK_WORDS],
        base[: 4 * BLOCK_WORDS],
    )
    assert not torch.equal(block_sums(moved), sums)
    # A half-precision view at an odd element: its bytes are not 4-aligned in the storage.
    halves = torch.arange(2 * words + 1, dtype=torch.float16)
    assert torch.equal(block_sums(halves[1:]), block_sums(halves[1:].clone()))
