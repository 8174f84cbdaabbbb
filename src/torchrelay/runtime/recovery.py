"""Recovery: following a plan into its generation (entered by :mod:`generations`), sending or
receiving state, and the waits between steps (for a slot, for a plan, for the job's end).

A mixin of :class:`torchrelay.runtime.relay.Relay`; it relies on the attributes that
``Relay.__init__`` sets (annotated below) and on :class:`ControlLink` and
:class:`ChaosInjection` for reports and injected faults.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchrelay.chaos import ChaosEvent
from torchrelay.control.protocol import (
    Abort,
    Done,
    Finish,
    Halted,
    Message,
    Park,
    PhaseDone,
    Plan,
    Progress,
    Ready,
    Report,
    Retire,
)
from torchrelay.control.slot_runs import expand
from torchrelay.control.wire import WireError, seal, unseal
from torchrelay.progress import ByteProgress
from torchrelay.runtime.env import RelayEnv
from torchrelay.runtime.generations import GenerationEntry
from torchrelay.runtime.guard import GenerationAborted
from torchrelay.runtime.handover_boundary import HandoverBoundary
from torchrelay.runtime.replicas import AgreementCheck, LocalMirror
from torchrelay.runtime.tracked import TrackedState
from torchrelay.runtime.warmup import signature_of, warm_ddp, warm_model, warm_optimizer
from torchrelay.transfer.buffers import Prefault, publish_layout, room_for_a_copy
from torchrelay.transfer.engine import receive_state, schema_key, send_state
from torchrelay.transfer.sums import ChunkSums

IDLE_POLL = 0.2  # seconds between a waiting spare's looks for its warm-up's input signature
SIGNATURE_KEY = "torchrelay/input_signature"


class Recovery(GenerationEntry):
    """Generation changes and state transfer (see :class:`Relay`); the attributes it shares
    with :class:`GenerationEntry` are annotated there."""

    env: RelayEnv
    tracked: TrackedState
    local: LocalMirror | None
    _store_address: str
    _waiting: Report | None
    _waiting_lock: threading.RLock
    _handover: HandoverBoundary
    _chaos: list[ChaosEvent]
    _first_after_recovery: bool
    _state_valid: bool
    _prefault: Prefault | None
    _layout_shared: int
    _sums: ChunkSums | None
    _agreement: AgreementCheck
    _current_step: int | None
    _set_chaos: Callable[[list[ChaosEvent]], None]

    def _report_and_wait(
        self, report: Report, *kinds: type[Message], idle: Callable[[], bool] | None = None
    ) -> Message:
        """Send ``report`` and wait for a message of one of ``kinds`` (running ``idle`` while
        none comes, see ``_next_message``); while this process waits, a new leader gets
        ``report`` again (see ``ControlLink._on_new_leader``)."""
        with self._waiting_lock:
            self._waiting = report
        self._send(report)
        message = self._next_message(*kinds, idle=idle)
        with self._waiting_lock:
            self._waiting = None
        return message

    def _await_assignment(self) -> None:
        """Warm up, report ready, and wait for a slot (warming the model once rank 0 has
        published its input signature, if it had not yet)."""
        for optimizer in self.tracked.optimizers():
            warm_optimizer(optimizer)
        # While it waits, the spare maps the memory it will receive into (transfer.buffers).
        own = {"step": self.committed, "objects": self.tracked.state()}
        self._prefault = Prefault(self._store_address, self.env.token, own, self.device)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        ready = Ready(
            cpu_seconds=round(usage.ru_utime + usage.ru_stime, 4),
            forked=self.env.forked,
        )
        message = self._report_and_wait(ready, Plan, Finish, idle=self._warm_model)
        if not isinstance(message, Plan):
            self._closing.set()
            raise SystemExit(0)
        self._apply_plan(message)

    def _watch_inputs(self, module: torch.nn.Module) -> None:
        """Rank 0 publishes the shapes of ``module``'s inputs at its first step, for spares
        to warm their model with (see :mod:`warmup`); sealed, as anything a process acts on."""
        published = False

        def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            nonlocal published
            if published or self.rank != 0 or self._current_step is None:
                return
            published = True
            body = {"signature": signature_of(args, kwargs)}
            with contextlib.suppress(dist.DistError, RuntimeError):  # a warm-up is optional
                self._store.set(SIGNATURE_KEY, seal(body, self.env.token))

        module.register_forward_pre_hook(hook, with_kwargs=True)

    def _warm_model(self) -> bool:
        """Idle work of a waiting spare: warm the tracked model once its input signature is
        published; ``True`` when there is nothing left to do (warmed, or cannot be)."""
        modules = self.tracked.modules()
        if not modules:
            return True
        try:
            if not self._store.check([SIGNATURE_KEY]):
                return False
            signature = unseal(self._store.get(SIGNATURE_KEY), self.env.token)["signature"]
        except (dist.DistError, RuntimeError, WireError, KeyError):
            return True
        module = modules[0]
        if not isinstance(signature, dict):
            return True
        if not isinstance(module, DistributedDataParallel):
            warm_model(module, signature, self.device)
            return True
        # The bare module first: a DDP pass that failed half-way would leave its reducer
        # waiting for a backward, so DDP's own pass runs only on a graph known to work.
        if warm_model(module.module, signature, self.device):
            warm_ddp(module, self.process_group, signature, self.device)
        return True

    def _handover_due(self) -> bool:
        """Whether this rank stops here for a planned handover (see
        :mod:`torchrelay.runtime.handover_boundary`)."""
        return self._handover.due(self.generation, self.committed)

    def _recover(self, in_flight: int | None) -> None:
        self._hash_while_halted()
        halted = Halted(committed=self.committed, in_flight=in_flight)
        message = self._report_and_wait(halted, Plan, Retire, Finish)
        if isinstance(message, Retire):
            self._retire()
        if not isinstance(message, Plan):
            raise RuntimeError("the job ended while this worker was waiting to recover")
        self._apply_plan(message)

    def _retire(self) -> None:
        """Leave the job: this slot now runs elsewhere (a drain or a health migration). The
        script's code after its loop does not run here; its new process runs it."""
        self._closing.set()
        print("torchrelay: this process's slot was handed over; leaving", file=sys.stderr)
        raise SystemExit(0)

    def _room_to_keep(self, state: Any) -> bool:
        """Whether this rank, holding valid state, can receive beside it; says so if not."""
        if room_for_a_copy(state, self.device):
            return True
        self._warn(
            f"torchrelay: rank {self.rank} receives state in place: no room for a second copy "
            "beside its own, so if this transfer fails it holds no state a recovery could use",
            what="receive_in_place",
        )
        return False

    def _hash_while_halted(self) -> None:
        """A rank that may be chosen as a source hashes its state's chunks while it waits for
        the plan, off the transfer's path (see :mod:`torchrelay.transfer.sums`)."""
        if self.rank is not None and self._state_valid and self._sums is None:
            self._sums = ChunkSums({"step": self.committed, "objects": self.tracked.state()})

    def _share_layout(self) -> None:
        """At its first commit in a generation, rank 0 publishes the state's layout, which
        waiting spares prepare their receive buffers from (see :mod:`torchrelay.transfer.buffers`).
        """
        if self.rank == 0 and self._layout_shared != self.generation:
            self._layout_shared = self.generation
            own = {"step": self.committed, "objects": self.tracked.state()}
            publish_layout(self._store, self.env.token, own)

    def _report_resumed(self) -> None:
        """Once per recovery: the first committed step (or the end, if no step was left)."""
        if self._first_after_recovery:
            self._first_after_recovery = False
            resumed = Progress(step=self.committed, first_after_recovery=True, t=time.time())
            self._post(resumed)

    def _finish(self) -> bool:
        """At the last step: wait for the job's end, serving recoveries meanwhile."""
        self._report_resumed()
        self._send(Done(step=self.committed))
        while True:
            message = self._next_message(Plan, Finish, Abort)
            if isinstance(message, Finish):
                self._closing.set()
                return True
            if isinstance(message, Abort) and message.generation == self.generation:
                self._hash_while_halted()
                self._send(Halted(committed=self.committed, in_flight=None))
            elif isinstance(message, Plan):
                self._apply_plan(message)
                return False

    def _next_message(
        self, *kinds: type[Message], idle: Callable[[], bool] | None = None
    ) -> Message:
        """The next message of one of ``kinds``; while none comes, ``idle()`` is called
        every :data:`IDLE_POLL` seconds until it returns ``True`` (done)."""
        while True:
            try:
                message = self._inbox.get(timeout=None if idle is None else IDLE_POLL)
            except queue.Empty:
                if idle is not None and idle():
                    idle = None
                continue
            if isinstance(message, Park):
                self._park()  # type: ignore[attr-defined]  # transparent mode (runtime.parking)
            elif isinstance(message, kinds):
                return message

    def _apply_plan(self, plan: Plan) -> None:
        """Join the plan's generation and send or receive state; retry on newer plans.

        If the generation is aborted (a member died meanwhile) or the transfer fails, report
        halted -- with ``valid=False`` if this rank's state may be half-overwritten, so it is
        never chosen as a source -- and follow the controller's next plan.
        """
        while True:
            try:
                self._enter(plan)
                return
            except (GenerationAborted, RuntimeError) as exc:
                self._hash_while_halted()
                halted = Halted(
                    committed=self.committed,
                    in_flight=None,
                    valid=self._state_valid,
                    reason=str(exc),
                )
                plan = self._report_and_wait(halted, Plan, Retire)  # type: ignore[assignment]
                if isinstance(plan, Retire):
                    self._retire()

    def _enter(self, plan: Plan) -> None:
        generation, slot, target = plan.generation, plan.slot, plan.target_step
        sources, receivers = expand(plan.sources), list(plan.receivers)
        # A survivor's degraded hardware stays degraded: it keeps its own slow events.
        kept = [e for e in self._chaos if e.action == "slow"]
        handed = [ChaosEvent.from_dict(e) for e in plan.chaos]
        self._set_chaos(kept + [e for e in handed if e not in kept])
        if plan.store is not None and plan.store != self._store_address:
            # A new leader serves the rendezvous store: the first one died with its host.
            host, _, port = plan.store.rpartition(":")
            self._store = dist.TCPStore(host, int(port), is_master=False, timeout=self._timeout)
            self._store_address = plan.store
        members = tuple(expand(plan.members))
        hosted = {int(v): host for v, host in (plan.hosted or {}).items()}
        self._agreement.planned(generation)
        self._bind(generation, slot, members, hosted, resuming=target + 1)
        # The transfer runs among the group's members: slots -> their place in it.
        member = {s: i for i, s in enumerate(members)}
        sources = [member[s] for s in sources]
        receivers = [member[s] for s in receivers]
        me = member[slot]
        # Posted: a round trip to the controller here (1.5-2.5 ms on the benchmark machine) was
        # on every member's way to the transfer.
        self._post(PhaseDone(phase="comm_ready", t=time.time()))
        self._maybe_fire("transfer", step=target + 1)
        own = self.tracked.state()
        prepared = None if self._prefault is None else self._prefault.take()
        ready, self._prefault, self._sums = self._sums, None, None
        if ready is not None and me not in sources:
            ready.take()  # stop hashing: this rank sends nothing
        inner = self.process_group.inner
        assert inner is not None
        wait = functools.partial(self.guard.wait_works, timeout=self._timeout)
        if me in sources:
            if self.committed != target or not self._state_valid:
                raise RuntimeError(f"source rank {slot} is at step {self.committed}, not {target}")
            result = send_state(
                inner,
                self._store,
                self.env.token,
                generation,
                {"step": target, "objects": own},
                me,
                sources,
                receivers,
                wait=wait,
                # Every source holds every rank's local state; the receiver takes its slot's.
                sidecar=None if self.local is None else self.local.for_transfer(),
                ready=ready,
            )
        elif me in receivers:
            mine = {"step": self.committed, "objects": own}
            # A laggard's state stays a source for the next plan if this transfer fails
            # (its last source dies): received aside, loaded once verified (transfer.buffers).
            keep = self._state_valid and self._room_to_keep(mine)
            self._state_valid = keep
            self._await_keys(self._store, [schema_key(generation)])
            result = receive_state(
                inner,
                self._store,
                self.env.token,
                generation,
                mine,
                sources,
                wait=wait,
                progress=lambda total: (
                    ByteProgress(f"torchrelay: rank {slot} receiving state", total).add
                ),
                prepared=prepared,
                keep_own=keep,
            )
            self._state_valid = False
            self.tracked.load(result.state["objects"], own)
            self.committed = int(result.state["step"])
            self._state_valid = True
            if self.local is not None and result.sidecar is not None:
                warning = self.local.receive(result.sidecar, slot, target)
                if warning is not None:
                    self._warn(warning, what="local_state_inexact")
        else:
            result = None
        done = PhaseDone(
            phase="transfer_done",
            t=time.time(),
            bytes=0 if result is None else result.bytes,
            seconds=0.0 if result is None else result.seconds,
        )
        self._post(done)
        self._first_after_recovery = True
