"""The compiled step guard (runtime/native_guard.cpp): built by the launcher, loaded by workers,
and completing an in-place collective as the Python guard does. The collective tests run
twice, compiled and Python, in two real processes over a real gloo group."""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import weakref
from pathlib import Path

import pytest
import torch
from torch.futures import Future

from tests.conftest import require_built
from tests.gloo_pair import join_pair, run_pair
from torchrelay.agent import native_build
from torchrelay.runtime import native_guard
from torchrelay.runtime.guard import StepGuard


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
    monkeypatch.setenv(native_guard.SWITCH, "0")
    native_guard.load.cache_clear()
    assert native_guard.load() is None and not StepGuard().native
    monkeypatch.setenv(native_guard.SWITCH, "1")
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path))  # nothing built there
    native_guard.load.cache_clear()
    try:
        assert native_guard.load() is None
    finally:
        monkeypatch.undo()
        native_guard.load.cache_clear()


def test_the_compiled_guard_loads_where_it_is_built():
    require_built()
    native_guard.load.cache_clear()
    assert native_guard.load() is not None and StepGuard().native


def test_the_compiled_guard_is_loaded_only_from_this_users_own_directories(
    monkeypatch, tmp_path, capfd
):
    """Code is loaded from the cache: a directory others can write to is refused."""
    require_built()
    built = native_guard.built_path()
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path / "cache"))
    copy = native_guard.built_path()
    assert built is not None and copy is not None
    native_guard.make_private_dirs(copy)
    shutil.copy2(built, copy)
    try:
        copy.parent.chmod(0o777)
        native_guard.load.cache_clear()
        assert native_guard.load() is None
        assert "not this user's alone" in capfd.readouterr().err
        copy.parent.chmod(0o700)
        native_guard.load.cache_clear()
        assert native_guard.load() is not None
    finally:
        monkeypatch.undo()
        native_guard.load.cache_clear()


def test_a_build_that_fails_is_one_line_and_is_not_retried_at_every_launch(monkeypatch, tmp_path):
    """A compiler that cannot compile: the launcher says why in one line, leaves the job to
    the Python guard, and the next launch does not compile again."""
    compiler = tmp_path / "c++"
    compiler.write_text(
        '#!/bin/sh\ncase "$1" in -v|--version|-dumpfullversion) exec g++ "$@";; esac\n'
        'echo "cc1plus: out of memory allocating 4096 bytes" >&2\nexit 1\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(native_guard.SWITCH, raising=False)
    lines: list[str] = []
    assert not native_build.ensure_native_guard(lines.append)
    assert len(lines) == 2 and "compiling" in lines[0]
    assert "did not build" in lines[1] and "Python step guard" in lines[1]
    build_dir = Path(str(native_guard.built_path())).parent
    logs = sorted(build_dir.glob("build-*.log"))
    assert len(logs) == 1 and "out of memory" in logs[0].read_text()
    again: list[str] = []
    assert not native_build.ensure_native_guard(again.append)
    assert len(again) == 1 and "to retry" in again[0]
    assert sorted(build_dir.glob("build-*.log")) == logs  # not compiled again


def test_nothing_is_built_or_imported_when_switched_off(monkeypatch, tmp_path):
    monkeypatch.setenv(native_guard.SWITCH, "0")
    monkeypatch.setenv("TORCHRELAY_CACHE", str(tmp_path))
    lines: list[str] = []
    assert not native_build.ensure_native_guard(lines.append)
    assert lines == [] and not any(tmp_path.iterdir())
