"""The control server's hand-off of reports to the controller (control/handoff.py): answers go
to their own callers, in arrival order, in batches; an exception is its caller's; a cancelled
caller is skipped; ``close`` ends the thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from torchrelay.control import handoff
from torchrelay.control.handoff import Handoff


def _run(test):
    return asyncio.run(asyncio.wait_for(test(), 60))


async def _blocked(hand: Handoff) -> tuple[asyncio.Future, threading.Event]:
    """A call that holds the hand-off's thread until the returned event is set."""
    entered, release = threading.Event(), threading.Event()

    def block(_: object) -> str:
        entered.set()
        release.wait()
        return "first"

    first = asyncio.ensure_future(hand.call(block, None))
    await asyncio.to_thread(entered.wait)
    return first, release


def test_calls_queued_behind_a_busy_thread_are_answered_in_order_in_few_batches(monkeypatch):
    settled: list[int] = []
    original = handoff._settle
    monkeypatch.setattr(
        handoff, "_settle", lambda outcomes: (settled.append(len(outcomes)), original(outcomes))
    )
    seen: list[int] = []

    def note(i: int) -> int:
        seen.append(i)
        return i * i

    async def test():
        hand = Handoff(asyncio.get_running_loop(), "test-handoff-order")
        first, release = await _blocked(hand)
        rest = [asyncio.ensure_future(hand.call(note, i)) for i in range(100)]
        await asyncio.sleep(0)  # every call is queued now
        release.set()
        answers = await asyncio.gather(first, *rest)
        hand.close()
        return answers

    answers = _run(test)
    assert answers == ["first"] + [i * i for i in range(100)]
    assert seen == list(range(100))
    # One wake of the loop per part of a batch, not one per call.
    assert sum(settled) == 101 and len(settled) <= 10, settled


def test_an_exception_is_its_callers_and_a_cancelled_caller_is_skipped():
    async def test():
        hand = Handoff(asyncio.get_running_loop(), "test-handoff-errors")
        first, release = await _blocked(hand)
        failing = asyncio.ensure_future(hand.call(lambda x: 1 // x, 0))
        dropped = asyncio.ensure_future(hand.call(lambda x: x, "dropped"))
        kept = asyncio.ensure_future(hand.call(lambda x: x + 1, 1))
        await asyncio.sleep(0)
        dropped.cancel()
        release.set()
        with pytest.raises(ZeroDivisionError):
            await failing
        with pytest.raises(asyncio.CancelledError):
            await dropped
        answers = (await first, await kept, await hand.call(lambda x: x, "after"))
        hand.close()
        return answers

    assert _run(test) == ("first", 2, "after")


def test_close_ends_the_thread():
    async def test():
        hand = Handoff(asyncio.get_running_loop(), "test-handoff-close")
        assert await hand.call(lambda x: x, 7) == 7
        hand.close()

    _run(test)
    for thread in threading.enumerate():
        if thread.name == "test-handoff-close":
            thread.join(30)
            assert not thread.is_alive()
