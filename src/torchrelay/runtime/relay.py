"""The public model-aware API: :func:`init`, :meth:`Relay.track`, :meth:`Relay.steps`.

A worker runs ordinary DDP code; ``Relay`` adds the few things live recovery needs:

- a stable process group (:mod:`facade`) for DDP, rebuilt underneath on every generation;
- a step loop that seeds RNG and picks the data from ``(seed, step, rank)``, commits a step
  only if all its collectives succeeded, and otherwise drops it and recovers before going on;
- the receiving and sending side of the state transfer.

A spare runs the same script: ``init()`` returns at once, the script builds its model and
optimizer locally, and the spare waits inside :meth:`Relay.steps` until it is given a slot (or
exits quietly with status 0 when the job ends without needing it).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchrelay.chaos import ChaosEvent
from torchrelay.control.lease import HEARTBEAT_RPC_TIMEOUT, keep_alive
from torchrelay.control.service import ControlClient, ControlError
from torchrelay.exits import EXIT_CONTROLLER_LOST, EXIT_FENCED
from torchrelay.runtime.data import step_loader
from torchrelay.runtime.ddp import fix_all_buckets, fix_buckets
from torchrelay.runtime.devices import new_group, select_device
from torchrelay.runtime.env import RelayEnv
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import GenerationAborted, StepGuard, guard_optimizer
from torchrelay.runtime.rng import SETUP_STEP, seed_all
from torchrelay.runtime.timing import StepTimer
from torchrelay.runtime.tracked import TrackedState, TrackingError
from torchrelay.transfer.engine import receive_state, schema_key, send_state

# A worker that has not got a heartbeat through for this many hang timeouts leaves on its own:
# by then the controller has fenced it and handed its slot to another process.
LEASE_FACTOR = 2.0
KEY_POLL = datetime.timedelta(milliseconds=200)


class Relay:
    """One process's membership in a torchrelay job. Create it with :func:`init`."""

    def __init__(
        self, env: RelayEnv, client: ControlClient, joined: dict[str, Any], seed: int
    ) -> None:
        self.env = env
        self.seed = seed
        self.device = select_device(env.local_rank)
        self.world_size = env.world_size
        self.rank: int | None = env.rank
        self.generation = int(joined["generation"])
        self.committed = -1
        self.guard = StepGuard()
        self.process_group = StableProcessGroup(env.world_size, self.guard)
        self.tracked = TrackedState()
        self._client = client
        self._timeout = datetime.timedelta(seconds=float(joined["collective_timeout"]))
        self._store = dist.TCPStore(
            env.master_addr, env.master_port, is_master=False, timeout=self._timeout
        )
        self._chaos = [ChaosEvent.from_dict(e) for e in joined["chaos"]]
        self._inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self._closing = threading.Event()
        self._current_step: int | None = None
        self._busy: str | None = None
        self._first_after_recovery = False
        self._last_commit_t: float | None = None  # wall time, for the survivors' stall
        self._state_valid = self.rank is not None  # a spare holds no state worth sending
        self._retired: list[dist.ProcessGroup] = []
        self.timer = StepTimer()
        seed_all(seed, SETUP_STEP, 0)
        # Heartbeats start before the first rendezvous: waiting for slow peers is not a hang.
        threading.Thread(target=self._heartbeat, name="torchrelay-heartbeat", daemon=True).start()
        if self.rank is not None:
            self._bind(self.generation, self.rank)
        threading.Thread(target=self._watch, name="torchrelay-watch", daemon=True).start()
        self.process_group.after_allreduce_launch = self._on_allreduce_launch
        _install_excepthook(self)

    # ------------------------------------------------------------------ public API
    @property
    def is_spare(self) -> bool:
        """True until this process is handed a slot."""
        return self.rank is None

    def track(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        **objects: Any,
    ) -> None:
        """Register the state to carry to a replacement.

        ``model`` may be a DDP module built with ``process_group=relay.process_group`` or
        its inner module (every DDP over that group is prepared for recovery either way);
        ``optimizer`` is guarded (its ``step`` is skipped in a dropped step); ``scheduler`` and
        ``objects`` are anything with ``state_dict()``/``load_state_dict()``.
        """
        named = {"model": model, "optimizer": optimizer, "scheduler": scheduler, **objects}
        for name, obj in named.items():
            if obj is None:
                continue
            self.tracked.add(name, obj)
            if isinstance(obj, torch.optim.Optimizer):
                guard_optimizer(obj, self.guard)
            if isinstance(obj, DistributedDataParallel):
                self._prepare_ddp(obj)
            if isinstance(obj, torch.nn.Module):
                obj.register_forward_pre_hook(lambda *_: self._maybe_fire("forward"))

    @contextlib.contextmanager
    def busy(self, reason: str) -> Iterator[None]:
        """Declare work that keeps this rank inside a step far longer than its usual step time
        (an evaluation, a checkpoint written by one rank), so that it is not taken for a stall
        while its peers wait. Its heartbeats go on meanwhile: a silent process is still hung.
        """
        self._busy = reason
        try:
            yield
        finally:
            self._busy = None

    def steps(
        self,
        dataset: Any = None,
        *,
        max_steps: int,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` for every step not yet committed, up to ``max_steps``.

        The batch is this rank's share of the global batch at ``step`` (``None`` without a
        dataset). A step whose collectives failed is dropped and yielded again after recovery,
        so the body must be the whole step: forward, backward, ``optimizer.step()``.
        """
        if dataset is not None and batch_size is None:
            raise ValueError("steps(dataset, ...) needs batch_size")
        fix_all_buckets(self.process_group)  # DDPs built over our group but not tracked
        if self.is_spare:
            self._await_assignment()
        batches: Iterator[Any] | None = None
        while True:
            step = self.committed + 1
            if step >= max_steps:
                if self._finish():
                    return
                batches = None
                continue
            if self.guard.aborted:
                self._recover(in_flight=None)
                batches = None
                continue
            if dataset is not None and batches is None:
                assert batch_size is not None and self.rank is not None
                batches = step_loader(
                    dataset, batch_size, self.world_size, self.rank, self.seed, step, collate_fn
                )
            snapshot = self.tracked.snapshot()
            self.guard.begin_step()
            seed_all(self.seed, step, self.rank)  # type: ignore[arg-type]
            self._current_step = step
            self.timer.start()
            yield step, (next(batches) if batches is not None else None)
            self._current_step = None
            if self.guard.poisoned and not self.guard.optimizer_applied:
                self.timer.abandon()
                self.tracked.restore(snapshot)
                for opt in self.tracked.optimizers():
                    opt.zero_grad(set_to_none=True)
                self._recover(in_flight=step)
                batches = None
                continue
            self.committed = step
            self._last_commit_t = time.time()
            self.timer.commit()
            self._report_resumed()
            if self.guard.poisoned:
                self._recover(in_flight=None)
                batches = None

    # ------------------------------------------------------------------ setup helpers
    def _prepare_ddp(self, model: DistributedDataParallel) -> None:
        if model.process_group is not self.process_group:
            raise TrackingError(
                "build DDP with process_group=relay.process_group so it survives "
                "communicator changes"
            )
        fix_buckets(model, self.process_group)

    # ------------------------------------------------------------------ generations
    def _bind(self, generation: int, rank: int) -> None:
        self.guard.enter_generation(generation)
        self.generation, self.rank = generation, rank
        os.environ["RANK"] = str(rank)
        store = dist.PrefixStore(f"torchrelay/g{generation}", self._store)
        if generation > 0:
            # Gloo's own rendezvous cannot be interrupted; meet on store keys first, so that a
            # member dying now aborts this generation instead of stalling it for the timeout.
            store.set(f"ready/{rank}", "1")
            self._await_keys(store, [f"ready/{r}" for r in range(self.world_size)])
        inner = new_group(store, rank, self.world_size, self._timeout, self.device)
        previous = self.process_group.bind(inner, rank, generation)
        if previous is not None:
            # Destroying a gloo group joins its threads, which may sit in a collective that
            # will only time out: drop the last reference off the training thread.
            self._retired.append(previous)
            del previous
            threading.Thread(target=self._release_retired, daemon=True).start()

    def _await_keys(self, store: dist.Store, keys: list[str]) -> None:
        """Wait until ``keys`` exist in ``store``, unless this generation is aborted first."""
        deadline = time.monotonic() + self._timeout.total_seconds()
        while True:
            if self.guard.aborted:
                raise GenerationAborted(f"generation {self.generation} aborted during rendezvous")
            try:
                store.wait(keys, KEY_POLL)
                return
            except dist.DistStoreError:
                if time.monotonic() > deadline:
                    raise

    def _release_retired(self) -> None:
        while self._retired:
            self._retired.pop()

    def _await_assignment(self) -> None:
        self._report("ready")
        message = self._next_message("plan", "finish")
        if message["type"] == "finish":
            self._closing.set()
            raise SystemExit(0)
        self._apply_plan(message)

    def _recover(self, in_flight: int | None) -> None:
        self._report("halted", committed=self.committed, in_flight=in_flight)
        message = self._next_message("plan", "finish")
        if message["type"] == "finish":
            raise RuntimeError("the job ended while this worker was waiting to recover")
        self._apply_plan(message)

    def _report_resumed(self) -> None:
        """Once per recovery: the first committed step (or the end, if no step was left)."""
        if self._first_after_recovery:
            self._first_after_recovery = False
            self._report("progress", step=self.committed, first_after_recovery=True, t=time.time())

    def _finish(self) -> bool:
        """At the last step: wait for the job's end, serving recoveries meanwhile."""
        self._report_resumed()
        self._report("done", step=self.committed)
        while True:
            message = self._next_message("plan", "finish", "abort")
            if message["type"] == "finish":
                self._closing.set()
                return True
            if message["type"] == "abort" and message["generation"] == self.generation:
                self._report("halted", committed=self.committed, in_flight=None)
            elif message["type"] == "plan":
                self._apply_plan(message)
                return False

    def _next_message(self, *kinds: str) -> dict[str, Any]:
        while True:
            message = self._inbox.get()
            if message["type"] in kinds:
                return message

    def _apply_plan(self, plan: dict[str, Any]) -> None:
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
                self._report(
                    "halted",
                    committed=self.committed,
                    in_flight=None,
                    valid=self._state_valid,
                    reason=str(exc),
                )
                plan = self._next_message("plan")

    def _enter(self, plan: dict[str, Any]) -> None:
        generation, slot = int(plan["generation"]), int(plan["slot"])
        target = int(plan["target_step"])
        sources, receivers = list(plan["sources"]), list(plan["receivers"])
        # A survivor's degraded hardware stays degraded: it keeps its own slow events.
        kept = [e for e in self._chaos if e.action == "slow"]
        handed = [ChaosEvent.from_dict(e) for e in plan["chaos"]]
        self._chaos = kept + [e for e in handed if e not in kept]
        self._bind(generation, slot)
        self._report("phase", phase="comm_ready", t=time.time())
        self._maybe_fire("transfer", step=target + 1)
        own = self.tracked.state()
        inner = self.process_group.inner
        assert inner is not None
        if slot in sources:
            if self.committed != target or not self._state_valid:
                raise RuntimeError(f"source rank {slot} is at step {self.committed}, not {target}")
            result = send_state(
                inner,
                self._store,
                self.env.token,
                generation,
                {"step": target, "objects": own},
                slot,
                sources,
                receivers,
                wait=self.guard.wait_works,
            )
        elif slot in receivers:
            self._state_valid = False
            self._await_keys(self._store, [schema_key(generation)])
            result = receive_state(
                inner,
                self._store,
                self.env.token,
                generation,
                {"step": self.committed, "objects": own},
                sources,
                wait=self.guard.wait_works,
            )
            self.tracked.load(result.state["objects"], own)
            self.committed = int(result.state["step"])
            self._state_valid = True
        else:
            result = None
        self._report(
            "phase",
            phase="transfer_done",
            t=time.time(),
            bytes=0 if result is None else result.bytes,
            seconds=0.0 if result is None else result.seconds,
        )
        self._first_after_recovery = True

    # ------------------------------------------------------------------ chaos
    def _on_allreduce_launch(self) -> None:
        self.timer.collective_launched()
        self._maybe_fire("backward")

    def _maybe_fire(self, phase: str, step: int | None = None) -> None:
        step = self._current_step if step is None else step
        if step is None:
            return
        for event in self._chaos:
            if event.action == "slow" and step >= event.step and phase == "forward":
                if step == event.step:
                    self._report("chaos_fired", id=event.id)
                # The injected fault itself: this rank computes slower from now on.
                time.sleep(event.seconds)
            elif event.step == step and event.phase == phase and event.action != "slow":
                self._report("chaos_fired", id=event.id)
                self._inject(event.action)

    def _inject(self, action: str) -> None:
        if action == "drop":
            self.process_group.silence()
        elif action == "stall":
            # The training thread blocks for good; the heartbeat thread goes on.
            threading.Event().wait()
        elif action == "freeze":
            # A C call that never releases the GIL: no thread of this process runs again.
            ctypes.PyDLL(None).sleep(10**6)
        else:
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)

    # ------------------------------------------------------------------ control plane
    def _report(self, kind: str, **body: Any) -> dict[str, Any]:
        if kind == "halted":  # how long the survivors stall is measured from their last commit
            body.setdefault("last_commit_t", self._last_commit_t)
        try:
            return self._client.report(kind, generation=self.generation, **body)
        except ControlError as exc:
            _die_on_control_error(exc)
            raise

    def _watch(self) -> None:
        try:
            for message in self._client.watch():
                if message["type"] == "abort":
                    self.guard.abort(int(message["generation"]))
                    self.process_group.abort(int(message["generation"]))
                self._inbox.put(message)
        except ControlError as exc:
            if not self._closing.is_set():
                _die_on_control_error(exc)

    def _heartbeat(self) -> None:
        """Sign of life and progress, off the training thread (never on the critical path).

        Also a lease (see :mod:`torchrelay.control.lease`): a worker whose heartbeats have not
        got through for ``LEASE_FACTOR`` hang timeouts -- a network partition -- exits, so an
        isolated replica never outlives its fencing.
        """

        def beat() -> float:
            reply = self._client.report(
                "progress",
                timeout=HEARTBEAT_RPC_TIMEOUT,
                generation=self.generation,
                step=self.committed,
                step_age=self.timer.step_age(),
                waiting=self.guard.oldest_wait(),
                busy=self._busy,
                **self.timer.medians(),
            )
            return LEASE_FACTOR * float(reply["hang_timeout"])

        def expired(silence: float, lease: float, error: ControlError) -> None:
            print(
                f"torchrelay: no heartbeat reached the controller for {silence:.1f} s (lease "
                f"{lease:.1f} s, last error {error.code}); this replica is presumed replaced "
                "and stops here",
                file=sys.stderr,
                flush=True,
            )
            os._exit(EXIT_FENCED)

        keep_alive(beat, self._closing, _die_on_control_error, expired)


def _die_on_control_error(exc: ControlError) -> None:
    if exc.code == "FAILED_PRECONDITION":
        print(
            f"torchrelay: this process was fenced out of the job and must not continue: "
            f"{exc.message}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_FENCED)
    if exc.code in ("UNAVAILABLE", "CANCELLED"):
        print(
            f"torchrelay: lost the controller ({exc.message}); the launcher is gone, exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_CONTROLLER_LOST)


def _install_excepthook(relay: Relay) -> None:
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        text = "".join(traceback.format_exception(kind, exc, tb))
        with contextlib.suppress(ControlError):
            relay._client.report("error", step=relay._current_step, traceback=text, timeout=5.0)
        previous(kind, exc, tb)

    sys.excepthook = hook


def init(seed: int = 0) -> Relay:
    """Join the job this process was launched into by ``torchrelay run``.

    Seeds every RNG identically on all ranks (so models are built identically), picks the
    device (``relay.device``: this process's GPU with NCCL when CUDA is available, else the CPU
    with gloo; see :mod:`torchrelay.runtime.devices`), opens the stable process group, and
    returns the :class:`Relay`. On a spare it returns at once; the
    spare waits for a slot in :meth:`Relay.steps`.
    """
    env = RelayEnv.from_environ()
    client = ControlClient(env.control, env.token, env.process)
    joined = client.join(env.role, os.getpid(), env.node, env.rank)
    return Relay(env, client, joined, seed)
