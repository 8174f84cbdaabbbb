"""The public model-aware API: :func:`init`, :meth:`Relay.track`, :meth:`Relay.steps`.

A worker runs ordinary DDP code; ``Relay`` adds the few things live recovery needs:

- a stable process group (:mod:`facade`) for DDP, rebuilt underneath on every generation;
- a step loop that seeds RNG and picks the data from ``(seed, step, rank)``, commits a step
  only if all its collectives succeeded, and otherwise drops it and recovers before going on;
- the receiving and sending side of the state transfer (:mod:`recovery`), the control-plane
  link (:mod:`control_link`) and chaos injection (:mod:`chaos_inject`), mixed in from their
  own modules.

A spare runs the same script: ``init()`` returns at once, the script builds its model and
optimizer locally, and the spare waits inside :meth:`Relay.steps` until it is given a slot (or
exits quietly with status 0 when the job ends without needing it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchrelay.chaos import ChaosEvent
from torchrelay.control.service import ControlClient
from torchrelay.runtime.chaos_inject import ChaosInjection
from torchrelay.runtime.control_link import ControlLink, install_excepthook
from torchrelay.runtime.data import step_loader
from torchrelay.runtime.devices import select_device
from torchrelay.runtime.env import RelayEnv
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard, guard_optimizer
from torchrelay.runtime.recovery import Recovery
from torchrelay.runtime.rng import SETUP_STEP, seed_all
from torchrelay.runtime.timing import StepTimer
from torchrelay.runtime.tracked import TrackedState, TrackingError


class Relay(ControlLink, Recovery, ChaosInjection):
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
        install_excepthook(self)

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

        ``model`` may be a DDP module built with ``process_group=relay.process_group``;
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
        # The controller refuses any step claim beyond it (and a rank that disagrees).
        self._report("max_steps", max_steps=max_steps)
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
        # DDP re-orders its gradient buckets after the first backward and syncs the new order
        # from rank 0. A replacement would do that at its first step while the survivors did it
        # long ago: mismatched collectives. Fix the layout now, identically on every rank.
        with self.process_group.local():
            model.reducer._push_all_rebuilt_params()
            model.reducer._rebuild_buckets()

    # ------------------------------------------------------------------ generations


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
