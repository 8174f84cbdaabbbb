"""One collective call of the stable process group, and how it runs in the caller's own
tensors on a gloo group that an abort can cut (see :mod:`torchrelay.runtime.facade`).

The caller is released only once the inner work has ended, so nothing of an aborted
generation writes into its buffers later; a work a cut does not end within
:data:`CUT_GRACE_S` makes the process leave (see :func:`_await_end`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from torchrelay.exits import EXIT_COMMUNICATOR_STUCK, leave
from torchrelay.runtime.guard import StepGuard

# Starts a collective on a communicator, writing into the given tensors.
Launch = Callable[[dist.ProcessGroup, list[torch.Tensor]], dist.Work]
# A cut ends a gloo work in about a millisecond (gloo_cut), except a send whose write was left
# partial (see _await_end), which only gloo's own timeout ends: past this, this process leaves.
CUT_GRACE_S = 2.0


def completed(value: Any) -> dist.Work:
    """A work that has already completed with ``value``."""
    future: Future[Any] = Future()
    future.set_result(value)
    return _create_work_from_future(future)


@dataclass(frozen=True)
class Collective:
    """One collective call: the tensors it writes, how to start it on a communicator, what
    its future holds, and what to do with the outputs once it succeeded (``None``: nothing).
    ``plain``: its future holds its outputs and nothing follows it (an all-reduce, a
    broadcast), so the compiled guard can complete it."""

    outputs: list[torch.Tensor]
    launch: Launch
    result: Any
    expand: Callable[[list[torch.Tensor]], None] | None
    plain: bool = False


def in_place(
    guard: StepGuard, inner: dist.ProcessGroup, cut: Callable[[], None], call: Collective
) -> dist.Work:
    """The collective in the caller's own tensors, on ``inner``, a group that ``cut`` cuts
    (:meth:`StableProcessGroup.abort` of the generation it runs in; a group replaced since
    was cut when it was). What an abort runs does not hold ``inner``: the guard keeps a
    finished collective's entry until the next one starts, and parking must be able to close
    the group's sockets by dropping it.

    The caller's future is the inner work's, chained so that a failure poisons the step
    instead of raising: by the compiled guard where it is built (no Python on completion, see
    :mod:`native`), else by one Python callback on gloo's thread. It completes only once
    the inner work has ended, so nothing of an aborted generation writes into the caller's
    buffers after it is released. An abort cuts the group, which ends the work within
    milliseconds (see :func:`_await_end` for one that does not)."""

    def on_abort(future: Future[Any] | None) -> None:
        cut()
        if future is not None:
            watch_end(future)

    ticket = guard.track(on_abort)
    if ticket is None:
        guard.poison("generation aborted")
        return completed(call.result)
    try:
        work = call.launch(inner, call.outputs)
    except RuntimeError as exc:
        guard.untrack(ticket)
        guard.poison(f"collective failed to start: {exc}")
        return completed(call.result)
    started = work.get_future()
    future = guard.chain_native(started, call.outputs) if call.plain else None
    if future is None:
        future = started.then(functools.partial(_finish, guard, call))
    if not guard.launched(ticket, future):
        watch_end(future)  # aborted while it started: the abort cut the group, not watched it
    return _create_work_from_future(future)


def _finish(guard: StepGuard, call: Collective, done: Future[Any]) -> Any:
    """The Python completion of an in-place collective (see :func:`in_place`)."""
    try:
        done.wait()
    except RuntimeError as exc:
        guard.poison(f"collective failed: {exc}")
        return call.result
    if call.expand is not None:
        call.expand(call.outputs)
    return call.result


def watch_end(future: Future[Any]) -> None:
    """Watch a collective whose group an abort cut, until it ends (see :func:`_await_end`)."""
    ended = threading.Event()
    future.add_done_callback(lambda _: ended.set())
    threading.Thread(target=_await_end, args=(ended,), daemon=True).start()


def _await_end(ended: threading.Event) -> None:
    """Watch an aborted in-place collective: after a cut, its work ends within milliseconds
    (which releases the caller); one that does not may still write into the caller's buffers
    during a later step: this process then leaves (the job replaces it like any failed
    worker) rather than risk it.

    One case is known (torch 2.13's gloo): a send whose write to the socket was left partial
    (more than the socket buffer; a new connection's buffer is small) waits in the pair's
    transmit queue, and when the pair fails, gloo signals the queued sends of bound buffers
    only, not those of the unbound buffers its collectives use. Such a work ends only at the
    collective timeout (``tests/test_gloo_stuck_send.py`` builds one), so the grace is short."""
    if not ended.wait(CUT_GRACE_S):
        leave(
            EXIT_COMMUNICATOR_STUCK,
            f"a collective of an aborted generation did not end {CUT_GRACE_S:.0f} s after its "
            "connections were cut; leaving so that it cannot write into later steps' buffers",
        )
