"""Replay refusal and bounded logging of refused requests, as plain objects (no sockets)."""

from __future__ import annotations

import pytest

from torchrelay.control.rejections import SAMPLES, Rejections, worth_a_line
from torchrelay.control.replay import ReplayGuard
from torchrelay.control.wire import Sealed, WireError
from torchrelay.ledger import Ledger, read_ledger


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def refusal(guard: ReplayGuard, sender: str, message: Sealed) -> str:
    with pytest.raises(WireError) as err:
        guard.admit(sender, message)
    return err.value.reason


def test_a_message_is_admitted_once():
    guard = ReplayGuard(window=60, clock=Clock())
    message = Sealed({"kind": "progress"}, "n1", 1000.0)
    guard.admit("worker0", message)
    assert refusal(guard, "worker0", message) == "replayed"
    guard.admit("worker0", Sealed({"kind": "progress"}, "n2", 1000.0))
    guard.admit("worker1", message)  # nonces are per sender


@pytest.mark.parametrize("sent", [1000.0 - 61, 1000.0 + 61, float("nan"), float("inf")])
def test_a_message_outside_the_freshness_window_is_stale(sent):
    guard = ReplayGuard(window=60, clock=Clock())
    assert refusal(guard, "worker0", Sealed({}, "n", sent)) == "stale"


def test_a_replay_after_the_window_is_stale_and_memory_is_bounded():
    clock = Clock()
    guard = ReplayGuard(window=60, clock=clock)
    for i in range(1000):
        guard.admit("worker0", Sealed({}, f"n{i}", clock.now))
        clock.now += 0.5
    # Only the last window's nonces are remembered (~120 at two messages a second).
    assert len(guard) <= 121
    clock.now += 61
    assert len(guard) == 0
    assert refusal(guard, "worker0", Sealed({}, "n999", clock.now - 61.5)) == "stale"


def test_refusals_are_counted_and_only_a_sample_is_logged(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    rejections = Rejections(ledger)
    for i in range(2000):
        rejections.record("unauthenticated", "wrong job token", f"ipv4:10.0.0.1:{i}")
    rejections.record("replayed", "replayed control request refused", "ipv4:10.0.0.2:1")
    ledger.close()
    assert rejections.counts() == {"unauthenticated": 2000, "replayed": 1}
    events = read_ledger(tmp_path / "ledger.jsonl")
    counts = [e["count"] for e in events if e["reason"] == "unauthenticated"]
    assert counts == [1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert [e["event"] for e in events].count("rejected_message") == SAMPLES + 1


def test_which_refusals_get_a_ledger_line():
    lines = [n for n in range(1, 5000) if worth_a_line(n)]
    assert lines == [1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
