"""The compiled step guard (runtime/native_guard.cpp, in the extension runtime/native.py builds
and loads): completing an in-place collective as the Python guard does. The collective tests run
twice, compiled and Python, in two real processes over a real gloo group."""

from __future__ import annotations

import gc
import multiprocessing
import os
import weakref

import pytest
import torch
from torch.futures import Future

from tests.conftest import require_built
from tests.gloo_pair import join_pair, run_pair
from torchrelay.runtime import native
from torchrelay.runtime.guard import NATIVE_SWITCH, StepGuard


def _mismatched_member(rank: int, port: int, results: multiprocessing.Queue) -> None:
    from torchrelay.runtime.devices import cuttable

    pair = join_pair(rank, port)
    guard, facade = pair.guard, pair.facade
    ones = torch.ones(4)
    facade.allreduce([ones]).wait()  # both members' ports are published by now: in place
    guard.begin_step()
    if rank == 1:  # a peer that dies before the next all-reduce: its connections close
        os._exit(0)
    mine = torch.full((5,), 7.0)
    try:
        facade.allreduce([mine]).wait()
        raised = False
    except RuntimeError:
        raised = True
    first = (ones.tolist(), cuttable(pair.inner), guard.native)
    results.put((*first, raised, guard.poisoned, guard.poison_reason or ""))
    guard.begin_step()  # the next step starts healthy
    results.put(guard.poisoned)


@pytest.mark.timeout(120)
def test_a_collective_that_fails_poisons_the_step_instead_of_raising(guard_kind):
    failed, poisoned_next_step = run_pair(_mismatched_member, reports=2)
    summed, in_place, native, raised, poisoned, reason = failed
    assert summed == [2.0] * 4 and in_place  # the healthy all-reduce ran in place
    assert native == (guard_kind == "compiled")
    assert not raised and poisoned and reason.startswith("collective failed: ")
    assert not poisoned_next_step


def _parking_member(rank: int, port: int, results: multiprocessing.Queue) -> None:
    from torchrelay.runtime.devices import cuttable

    pair = join_pair(rank, port)
    for _ in range(3):
        pair.facade.allreduce([torch.ones(4)]).wait()
    in_place = cuttable(pair.inner)
    pair.facade.unbind()  # what transparent mode's park does before its snapshot
    group = weakref.ref(pair.inner)
    del pair.inner
    gc.collect()
    results.put((rank, in_place, group() is None))
    # Rank 0 hosts the store: it leaves last, once rank 1 is done with it.
    if rank == 1:
        pair.store.set("done", "1")
    else:
        pair.store.wait(["done"])


@pytest.mark.timeout(120)
def test_a_finished_collective_does_not_keep_its_group_alive(guard_kind):
    """Parking drops the communicator to close its sockets (a snapshot refuses an open TCP
    connection); the guard's record of a finished collective must not hold it."""
    assert sorted(run_pair(_parking_member, reports=2)) == [(0, True, True), (1, True, True)]


def test_a_collective_stops_being_pending_when_its_future_ends():
    guard = StepGuard()
    guard.enter_generation(0)
    ticket = guard.track(lambda _future: None)
    assert ticket is not None and guard.oldest_wait() is not None
    future: Future[list[torch.Tensor]] = Future()
    assert guard.launched(ticket, future)
    assert guard.oldest_wait() is not None  # started, not ended
    future.set_result([torch.zeros(1)])
    assert guard.oldest_wait() is None


def test_the_guard_keeps_no_finished_collective_alive():
    """A finished collective's future holds its outputs; the guard forgets it by the next
    collective, so a loop of all-reduces outside any step does not pile tensors up."""
    guard = StepGuard()
    guard.enter_generation(0)
    finished: list[weakref.ref] = []
    for _ in range(50):
        outputs = [torch.zeros(1024)]
        future: Future[list[torch.Tensor]] = Future()
        ticket = guard.track(lambda _future: None)
        assert ticket is not None and guard.launched(ticket, future)
        future.set_result(outputs)
        finished.append(weakref.ref(outputs[0]))
        del outputs, future
    guard.track(lambda _future: None)
    assert sum(ref() is not None for ref in finished) == 0


def test_an_abort_settles_the_collectives_still_running_with_their_futures():
    guard = StepGuard()
    guard.enter_generation(4)
    settled: list[tuple[str, Future | None]] = []
    ended, running = Future(), Future()
    for name, future in (("ended", ended), ("running", running), ("unstarted", None)):
        ticket = guard.track(lambda f, name=name: settled.append((name, f)))
        if future is not None:
            guard.launched(ticket, future)
    ended.set_result([])
    guard.abort(4)
    assert settled == [("running", running), ("unstarted", None)]
    assert guard.poisoned and "aborted" in (guard.poison_reason or "")


def test_a_collective_that_starts_after_the_abort_is_told_so():
    guard = StepGuard()
    guard.enter_generation(1)
    ticket = guard.track(lambda _future: None)
    guard.abort(1)
    assert ticket is not None and not guard.launched(ticket, Future())


def test_the_python_guard_runs_where_the_compiled_one_is_switched_off_or_not_built(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(NATIVE_SWITCH, "0")  # the extension may load: the guard does not use it
    assert not StepGuard().native
    monkeypatch.setenv(NATIVE_SWITCH, "1")
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path))  # nothing built there
    native.load.cache_clear()
    try:
        assert not StepGuard().native
    finally:
        monkeypatch.undo()
        native.load.cache_clear()


def test_the_compiled_guard_runs_where_the_extension_is_built():
    require_built()
    native.load.cache_clear()
    assert StepGuard().native
