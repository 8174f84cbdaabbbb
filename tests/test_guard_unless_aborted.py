"""StepGuard.call_unless_aborted: what cannot be interrupted (gloo's rendezvous, its
point-to-point waits) runs on a thread, and an abort of the generation releases the caller at
once; a result that comes too late is discarded, never used. Threads only, paced by events."""

from __future__ import annotations

import threading

import pytest

from torchrelay.runtime.guard import GenerationAborted, StepGuard


def _guard() -> StepGuard:
    guard = StepGuard()
    guard.enter_generation(3)
    return guard


def test_the_result_or_the_error_of_the_call_comes_back():
    guard = _guard()
    assert guard.call_unless_aborted(lambda: 42, "in test") == 42

    def fails() -> None:
        raise RuntimeError("connect refused")

    with pytest.raises(RuntimeError, match="connect refused"):
        guard.call_unless_aborted(fails, "in test")
    assert guard.oldest_wait() is None  # nothing left pending


def test_an_abort_releases_the_caller_and_a_late_result_is_discarded():
    guard = _guard()
    started, release = threading.Event(), threading.Event()
    discarded: list[str] = []
    discarded_event = threading.Event()

    def blocked() -> str:
        started.set()
        release.wait()
        return "late group"

    def discard(value: str) -> None:
        discarded.append(value)
        discarded_event.set()

    caller_error: list[BaseException] = []

    def caller() -> None:
        try:
            guard.call_unless_aborted(blocked, "in rendezvous", discard)
        except GenerationAborted as exc:
            caller_error.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    started.wait()
    assert guard.oldest_wait() is not None  # it counts as a pending collective meanwhile
    guard.abort(3)
    thread.join()  # released while the call still blocks
    assert "generation 3 aborted in rendezvous" in str(caller_error[0])
    assert discarded == []
    release.set()
    discarded_event.wait()
    assert discarded == ["late group"]


def test_an_aborted_generation_does_not_start_the_call():
    guard = _guard()
    guard.abort(3)
    ran = threading.Event()
    with pytest.raises(GenerationAborted):
        guard.call_unless_aborted(ran.set, "in rendezvous")
    assert not ran.is_set()


def test_a_result_that_comes_with_the_abort_is_discarded_too():
    guard = _guard()
    discarded: list[str] = []
    once = threading.Event()

    def aborted_meanwhile() -> str:
        guard.abort(3)  # the abort lands while the call returns its result
        return "group"

    def discard(value: str) -> None:  # by the caller or by the thread, whichever sees it last
        discarded.append(value)
        once.set()

    with pytest.raises(GenerationAborted):
        guard.call_unless_aborted(aborted_meanwhile, "in rendezvous", discard)
    once.wait()
    assert discarded == ["group"]
