"""The stable process-group facade that DDP (or user code) holds for the whole job.

DDP keeps one process group for its lifetime; torchrelay replaces the communicator on every
generation. :class:`StableProcessGroup` is a ``torch.distributed.ProcessGroup`` whose
collectives run on the current generation's inner group, with three guarantees:

- **never blocks on a dead generation**: every collective returns a future that the runtime
  completes itself, when the inner work finishes or when the controller aborts the generation.
  On a gloo group whose connections can be cut (:mod:`gloo_cut`, every group of two or more the
  runtime builds) the collective runs in the caller's own tensors, and an abort cuts the group:
  its works fail within milliseconds, and only then is the caller released, so that nothing of
  a dead generation can write into DDP's buffers later. Elsewhere (NCCL, a group whose sockets
  are not resolved yet) it runs on private copies, and a work that can never finish (a stopped
  peer) is abandoned with them.
- **fails into a poisoned step, not an exception**: a failed or aborted collective leaves its
  outputs untouched and poisons the step (see :mod:`guard`), so the user's loop body runs on
  and the runtime skips the optimizer and recovers at the next step boundary.
- **hosting** (``--elastic``, shrunk): the group underneath has fewer members than the job
  has ranks; :meth:`set_layout` maps each rank to the member that runs it (a broadcast's root,
  an all-gather's outputs follow it), and :attr:`contributions` turns a hosted rank's pass into
  an accumulating one (see :mod:`hosting`).
- **local mode** before a spare has peers: collectives answer locally (a broadcast keeps the
  local value, an all-gather replicates it). This serves the setup of a spare (DDP's initial
  parameter broadcast and shape check). Every tracked tensor is overwritten by the state
  transfer; untracked state built during setup keeps the spare's local values.
- **set-up** of a worker (before its first step): a collective runs on private copies, and
  one that the controller's abort ends (a peer lost while the job sets up) is answered
  locally, as a spare's are, so that DDP's constructor completes; the worker then recovers
  at its first step like any survivor. A failure before the abort arrives waits for it.

Where the extension is built, :func:`~torchrelay.runtime.fast_lane.stable_group` gives a
:class:`~torchrelay.runtime.fast_lane.NativeStableProcessGroup`:
the same group, whose all-reduces and broadcasts run in C++ once its Python path has seen
that they may run in place (see :mod:`fast_lane`); everything else is as described here.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    _create_work_from_future,
)
from torch.futures import Future

from torchrelay.runtime.collective import Collective, Launch, completed, in_place
from torchrelay.runtime.devices import abort_group, cuttable
from torchrelay.runtime.guard import StepGuard
from torchrelay.runtime.hosting import Contributions

if TYPE_CHECKING:
    from torchrelay.runtime.fast_lane import FastLane

# How long a failed set-up collective waits for the controller's abort: more than the
# controller takes to see any loss (a lost node: --node-timeout, 10 s by default).
SETUP_ABORT_WAIT_S = 60.0


def launch_options(opts: Any) -> Any:
    """A copy of a collective's options for the inner group, with ``asyncOp`` set.

    ``dist.all_reduce`` and the like pass ``asyncOp=False`` and wait on the work we return;
    told so, a backend may return no work at all (ProcessGroupNCCL queues the collective on
    the current stream and returns none, a barrier after a host sync), and the facade needs
    the inner work's future to settle its own. A copy: the caller's options stay as they
    were, a broadcast's root too (hosting maps it to a member)."""
    launched = type(opts)()
    for name in _option_fields(type(opts)):
        setattr(launched, name, getattr(opts, name))
    launched.asyncOp = True
    return launched


@functools.cache
def _option_fields(kind: type) -> tuple[str, ...]:
    return tuple(name for name in dir(kind) if not name.startswith("_") and name != "asyncOp")


class StableProcessGroup(dist.ProcessGroup):
    """A process group whose communicator is swapped per generation; see the module doc."""

    def __init__(self, size: int, guard: StepGuard) -> None:
        super().__init__(0, size)
        self._size = size
        self._rank = 0
        self._guard = guard
        self._inner: dist.ProcessGroup | None = None
        self._generation = -1
        self._inner_aborted = False
        self._bind_lock = threading.Lock()
        self._force_local = 0
        self._local_lock = threading.Lock()
        self._silenced = False
        self._layout: tuple[int, ...] | None = None  # None: rank r is member r
        self.contributions = Contributions()
        self._after_launch: Callable[[], None] | None = None
        self._last_launch = 0.0
        self._lane: FastLane | None = None  # NativeStableProcessGroup's

    # ------------------------------------------------------------- identity
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return "torchrelay"

    @property
    def inner(self) -> dist.ProcessGroup | None:
        return self._inner

    def set_layout(self, layout: tuple[int, ...] | None) -> None:
        """Which member of the inner group runs each rank (``None``: rank r is member r)."""
        shrunk = layout is not None and len(set(layout)) < self._size
        self._layout = layout if shrunk else None
        self._disarm()

    @property
    def after_allreduce_launch(self) -> Callable[[], None] | None:
        """Called after each all-reduce this group sends to its peers (chaos injection)."""
        return self._after_launch

    @after_allreduce_launch.setter
    def after_allreduce_launch(self, hook: Callable[[], None] | None) -> None:
        self._after_launch = hook
        self._disarm()

    def last_launch(self) -> float:
        """``time.monotonic()`` of the latest all-reduce sent to peers (0: none yet)."""
        fast = 0.0 if self._lane is None else self._lane.last_launch
        return max(self._last_launch, fast)

    def act_as(self, rank: int) -> None:
        """The rank whose micro-batch this process runs now (its own, or a hosted one)."""
        self._rank = rank

    def bind(
        self, inner: dist.ProcessGroup, rank: int, generation: int
    ) -> dist.ProcessGroup | None:
        """Route collectives to ``inner`` (generation ``generation``'s communicator) as
        ``rank``; return the communicator it replaces, aborted if it was NCCL."""
        with self._bind_lock:
            previous, self._inner, self._rank = self._inner, inner, rank
            self._generation = generation
            self._silenced = False
            aborted, self._inner_aborted = self._inner_aborted, False
        self._disarm()
        if previous is not None and not aborted:
            abort_group(previous)
        return previous

    def unbind(self) -> None:
        """Drop the communicator (transparent mode's park: no socket may stay open); the next
        :meth:`bind` gives a new one."""
        with self._bind_lock:
            inner, self._inner, self._inner_aborted = self._inner, None, False
        self._disarm()
        if inner is not None:
            abort_group(inner)  # closes the duplicates of its sockets too

    def abort(self, generation: int) -> None:
        """The controller aborted ``generation``: release its communicator's pending work
        (a NCCL kernel waiting for a dead peer would otherwise hold the GPU)."""
        with self._bind_lock:
            inner = self._inner
            if generation != self._generation or inner is None or self._inner_aborted:
                return
            self._inner_aborted = True
        self._disarm()
        abort_group(inner)

    def silence(self) -> None:
        """Fault injection: until the next :meth:`bind`, collectives are never sent and never
        complete (unless the generation is aborted), like a communicator that silently stopped
        delivering. Only the controller's lost-collective detection can cure this."""
        self._silenced = True
        self._disarm()

    @contextlib.contextmanager
    def local(self) -> Iterator[None]:
        """Answer collectives locally inside the block (used for rank-local DDP bookkeeping)."""
        with self._local_lock:
            self._force_local += 1
        self._disarm()
        try:
            yield
        finally:
            with self._local_lock:
                self._force_local -= 1

    @property
    def is_local(self) -> bool:
        """Collectives are answered locally: no peers yet, a local block, or a hosted rank's
        accumulating pass."""
        return self._inner is None or self._force_local > 0 or self.contributions.recording

    # ------------------------------------------------------------- collectives
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        epoch = self._epoch()
        opts = launch_options(opts if opts is not None else AllreduceOptions())
        if self.contributions.recording:
            self.contributions.keep(tensors, opts.reduceOp)
            return completed(tensors)
        if not self.is_local:
            self.contributions.combine(tensors, opts.reduceOp)
        work = self._run(tensors, lambda pg, out: pg.allreduce(out, opts), lambda: None, plain=True)
        if not self.is_local:
            self._last_launch = time.monotonic()
            if self._after_launch is not None:
                self._after_launch()
        self._arm(epoch)
        return work

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        epoch = self._epoch()
        opts = launch_options(opts if opts is not None else BroadcastOptions())
        if self._layout is not None:
            opts.rootRank = self._layout[opts.rootRank]  # the member that runs the root rank
        work = self._run(tensors, lambda pg, out: pg.broadcast(out, opts), lambda: None, plain=True)
        self._arm(epoch)
        return work

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> dist.Work:
        opts = launch_options(opts if opts is not None else AllgatherOptions())
        flat = [t for group in output_tensors for t in group]
        layout = self._layout
        # Shrunk: one output per member; each rank's output is the member's that runs it.
        firsts = None if layout is None else [layout.index(m) for m in range(max(layout) + 1)]

        def launch(pg: dist.ProcessGroup, out: list[torch.Tensor]) -> dist.Work:
            it = iter(out)
            regrouped = [[next(it) for _ in group] for group in output_tensors]
            if firsts is not None:
                regrouped = [[group[i] for i in firsts] for group in regrouped]
            return pg.allgather(regrouped, input_tensors, opts)

        def expand(out: list[torch.Tensor]) -> None:
            if layout is None or firsts is None:
                return
            for start in range(0, len(out), len(layout)):
                for rank, member in enumerate(layout):
                    if rank != firsts[member]:
                        out[start + rank].copy_(out[start + firsts[member]])

        def local() -> None:
            for group, source in zip(output_tensors, input_tensors, strict=True):
                for out in group:
                    out.copy_(source)

        return self._run(flat, launch, local, result=output_tensors, expand=expand)

    def barrier(self, opts: Any = None) -> dist.Work:
        opts = launch_options(opts if opts is not None else BarrierOptions())
        return self._run([], lambda pg, _: pg.barrier(opts), lambda: None)

    # ------------------------------------------------------------- the fast lane
    def _epoch(self) -> int:
        return 0 if self._lane is None else self._lane.epoch

    def _arm(self, epoch: int) -> None:
        """Arm the fast lane if an all-reduce or broadcast may run in place now, with no
        Python (see :mod:`fast_lane`): every condition :meth:`_run` and :meth:`allreduce`
        check, read after ``epoch``."""
        inner, guard = self._inner, self._guard
        if (
            self._lane is None
            or inner is None
            or self.is_local
            or self._layout is not None
            or self._after_launch is not None
            or self._silenced
            or self._inner_aborted
            or guard.setting_up
            or guard.aborted
            or not cuttable(inner)
        ):
            return
        self._lane.arm(inner, self._generation, epoch)

    def _disarm(self) -> None:
        """A condition of :meth:`_arm` changed: the Python path decides again."""
        if self._lane is not None:
            self._lane.disarm()

    def _run(
        self,
        outputs: list[torch.Tensor],
        launch: Launch,
        local: Callable[[], None],
        result: Any = None,
        expand: Callable[[list[torch.Tensor]], None] | None = None,
        plain: bool = False,
    ) -> dist.Work:
        result = outputs if result is None else result
        inner = self._inner
        setting_up = self._guard.setting_up
        if inner is None or self.is_local or (setting_up and self._guard.aborted):
            local()
            return completed(result)
        if self._guard.poisoned or self._guard.aborted:
            return completed(result)
        # In place where an abort ends the inner work for good (a cut gloo group), else on
        # private copies that a dead generation may go on writing into.
        call = Collective(outputs, launch, result, expand, plain)
        if setting_up:
            return self._on_copies(inner, call, local)
        if cuttable(inner) and not self._silenced:
            cut = functools.partial(self.abort, self._generation)
            return in_place(self._guard, inner, cut, call)
        return self._on_copies(inner, call)

    def _on_copies(
        self,
        inner: dist.ProcessGroup,
        call: Collective,
        in_setup: Callable[[], None] | None = None,
    ) -> dist.Work:
        """The collective on private copies, copied back only if it succeeds; an abort (or a
        silenced communicator's) releases the caller at once and abandons the copies.
        ``in_setup``: the local answer of a set-up collective (see the module doc), given on an
        abort instead of poisoning the step; its failures wait for the abort, at most
        :data:`SETUP_ABORT_WAIT_S`, and then poison (its outputs untouched)."""
        outputs, result, expand = call.outputs, call.result, call.expand
        scratch = [t.detach().clone() for t in outputs]
        future: Future[Any] = Future()
        settled = threading.Lock()
        guard = self._guard

        def settle(ok: bool, error: str = "") -> None:
            if not settled.acquire(blocking=False):
                return
            if ok:
                if expand is not None:
                    expand(scratch)
                for target, value in zip(outputs, scratch, strict=True):
                    target.copy_(value)
            elif in_setup is not None:
                in_setup()
            else:
                guard.poison(error or "collective aborted")
            future.set_result(result)

        def failed(reason: str) -> None:
            if in_setup is None:
                guard.untrack(ticket)
                settle(False, reason)
                return
            # In set-up, a peer's loss fails the work before the controller's abort comes:
            # that abort (still tracked) settles it, with the local answer. Without one, the
            # failure is the script's own (ranks that disagree): it poisons, as in a step.
            expiry = threading.Timer(SETUP_ABORT_WAIT_S, not_a_loss, args=(reason,))
            expiry.daemon = True
            expiry.start()

        def not_a_loss(reason: str) -> None:
            if settled.acquire(blocking=False):
                guard.untrack(ticket)
                guard.poison(f"{reason} (in set-up, and no abort followed)")
                future.set_result(result)

        ticket = guard.track(lambda _future: settle(False, "generation aborted"))
        if ticket is None:
            settle(False, "generation aborted")
            return _create_work_from_future(future)
        if self._silenced:
            return _create_work_from_future(future)
        try:
            work = call.launch(inner, scratch)
        except RuntimeError as exc:
            failed(f"collective failed to start: {exc}")
            return _create_work_from_future(future)

        def on_done(inner_future: Future[Any]) -> None:
            try:
                inner_future.wait()
            except RuntimeError as exc:
                failed(f"collective failed: {exc}")
                return
            guard.untrack(ticket)
            settle(True)

        work.get_future().add_done_callback(on_done)
        return _create_work_from_future(future)
