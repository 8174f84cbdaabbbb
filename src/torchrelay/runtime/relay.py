"""The public model-aware API: :func:`init`, :meth:`Relay.track`, :meth:`Relay.steps`.

A worker runs ordinary DDP code; ``Relay`` adds the few things live recovery needs:

- a stable process group (:mod:`facade`) for DDP, rebuilt underneath on every generation and
  installed as torch.distributed's default group (:mod:`default_group`);
- a step loop that seeds RNG and picks the data from ``(seed, step, rank)``, commits a step
  only if all its collectives succeeded, and otherwise drops it and recovers before going on;
- replicated state checked for agreement across ranks, and rank-local state mirrored to every
  peer (:mod:`replicas`);
- durable checkpoints of the tracked state with ``--checkpoint-dir``, and the load of one on
  ``--resume`` (:mod:`checkpoint`);
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
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from torchrelay.chaos import ChaosEvent
from torchrelay.control.client import ControlClient
from torchrelay.control.endpoint import failover_for
from torchrelay.control.protocol import JoinAnswer, MaxSteps, Message, Report
from torchrelay.control.report_stream import Lane
from torchrelay.runtime import default_group, exit_holder, stack_dump
from torchrelay.runtime.allocator import keep_freed_memory
from torchrelay.runtime.batch_feed import BatchFeed
from torchrelay.runtime.chaos_inject import ChaosInjection
from torchrelay.runtime.checkpoint import Checkpointer, resume_from_environ
from torchrelay.runtime.control_link import ControlLink, install_excepthook, posted_report_failed
from torchrelay.runtime.data import epoch_length, sampler_loader, step_loader
from torchrelay.runtime.ddp import fix_all_buckets, fix_buckets
from torchrelay.runtime.devices import select_device
from torchrelay.runtime.env import RelayEnv, host_pid
from torchrelay.runtime.fast_lane import stable_group
from torchrelay.runtime.guard import StepGuard, guard_optimizer
from torchrelay.runtime.handover_boundary import HandoverBoundary
from torchrelay.runtime.parking import Parking
from torchrelay.runtime.posting import Poster
from torchrelay.runtime.recovery import Recovery
from torchrelay.runtime.replicas import AgreementCheck, LocalMirror, describe
from torchrelay.runtime.rng import SETUP_STEP, seed_all
from torchrelay.runtime.timing import StepTimer
from torchrelay.runtime.tracked import TrackedState, TrackingError
from torchrelay.transfer.buffers import Prefault
from torchrelay.transfer.sums import ChunkSums


class Relay(ControlLink, Recovery, ChaosInjection, Parking):
    """One process's membership in a torchrelay job. Create it with :func:`init`."""

    def __init__(self, env: RelayEnv, client: ControlClient, joined: JoinAnswer, seed: int) -> None:
        self.env = env
        self.seed = seed
        keep_freed_memory()  # before the first step allocates anything large (runtime.allocator)
        self.device = select_device(env.local_rank)
        self.world_size = env.world_size
        self.rank: int | None = env.rank
        # --elastic, shrunk: the ranks this process runs besides its own (runtime.hosting)
        self.hosted: tuple[int, ...] = ()
        self.generation = joined.generation
        self.committed = -1
        self.guard = StepGuard()
        self.process_group = stable_group(env.world_size, self.guard)
        self.tracked = TrackedState()
        self.local: LocalMirror | None = None
        self.steps_per_epoch: int | None = None
        self._agreement = AgreementCheck()
        self._client = client
        self._timeout = datetime.timedelta(seconds=joined.collective_timeout)
        self._connect_within = datetime.timedelta(seconds=joined.rendezvous_timeout)
        self._store_address = f"{env.master_addr}:{env.master_port}"
        self._store = dist.TCPStore(
            env.master_addr, env.master_port, is_master=False, timeout=self._timeout
        )
        self._waiting: Report | None = None  # what this process waits on a plan with
        self._waiting_lock = threading.RLock()
        self._handover = HandoverBoundary()
        self._set_chaos([ChaosEvent.from_dict(e) for e in joined.chaos])
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._closing = threading.Event()
        self._current_step: int | None = None
        self._busy: str | None = None
        self._first_after_recovery = False
        self._last_commit_t: float | None = None  # wall time, for the survivors' stall
        self._state_valid = self.rank is not None  # a spare holds no state worth sending
        self._retired: list[dist.ProcessGroup] = []
        self._prefault: Prefault | None = None  # a spare's receive buffers, being prepared
        self._layout_shared = -1  # the last generation whose state layout this rank published
        self._sums: ChunkSums | None = None  # checksums of this rank's state, since its halt
        self.on_slot: Callable[[int], None] | None = None
        self._unparked = threading.Event()
        self._unparked.set()
        self._watch_paused = threading.Event()
        self._beating = threading.Lock()
        self._poster = Poster(
            lambda report: self._client.send_on(Lane.REPORTS, report), posted_report_failed
        )
        self.timer = StepTimer()
        self.checkpoints = Checkpointer.from_environ(
            env.world_size,
            lambda: self._store,
            lambda: self.generation,
            lambda line: self._warn(line, "checkpoint_failed"),
        )
        default_group.install(self.process_group, dist.PrefixStore("default_pg", self._store))
        seed_all(seed, SETUP_STEP, 0)
        # Heartbeats start before the first rendezvous: waiting for slow peers is not a hang.
        threading.Thread(target=self._heartbeat, name="torchrelay-heartbeat", daemon=True).start()
        # Watched before the first rendezvous: a peer lost in it is told by an abort.
        threading.Thread(target=self._watch, name="torchrelay-watch", daemon=True).start()
        if self.rank is not None:
            self._first_bind()
        install_excepthook(self)

    # ------------------------------------------------------------------ public API
    @property
    def is_spare(self) -> bool:
        """True until this process is handed a slot. A spare must not load a snapshot of its
        own: it receives the live state of the slot it takes."""
        return self.rank is None

    @property
    def epoch(self) -> int | None:
        """Epoch of the step in flight (outside the loop: of the next step); ``None`` until
        :meth:`steps` is iterated with data."""
        if self.steps_per_epoch is None:
            return None
        step = self.committed + 1 if self._current_step is None else self._current_step
        return step // self.steps_per_epoch

    def track(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        local: Any = None,
        **objects: Any,
    ) -> None:
        """Register the state to carry to a replacement.

        ``model`` may be a DDP module built with ``process_group=relay.process_group`` or
        its inner module (every DDP over that group is prepared for recovery either way);
        ``optimizer`` is guarded (its ``step`` is skipped in a dropped step); ``scheduler`` and
        ``objects`` are anything with ``state_dict()``/``load_state_dict()``. All of these are
        *replicated*: the same on every rank (checked at the first steps; a difference is
        reported), and a replacement receives a survivor's copy.

        ``local`` is small *rank-local* state (an object with ``state_dict()``/
        ``load_state_dict()``, or a plain dict, updated in place): mirrored to every peer at
        the end of each step, so a replacement receives its own slot's value. Its state must
        be tensors, numbers, strings and containers of them (see :mod:`replicas`).
        """
        if local is not None:
            if self.env.elastic:
                raise TrackingError(
                    "local= state is not supported with --elastic yet (a hosted rank's "
                    "local state has no copy of its own); run without --elastic"
                )
            if self.local is not None and self.local.obj is not local:
                raise TrackingError("local= is already tracked (track one object or dict)")
            self.local = LocalMirror(local)
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
                if obj is self.tracked.modules()[0]:
                    self._watch_inputs(obj)

    @contextlib.contextmanager
    def busy(self, reason: str) -> Iterator[None]:
        """Declare work that keeps this rank inside a step far longer than its usual step time
        (an evaluation, a checkpoint written by one rank), so that it is not taken for a stall
        while its peers wait. Its heartbeats go on meanwhile: a silent process is still hung."""
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
        start_step: int = 0,
    ) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` for every step not yet committed, up to ``max_steps``.

        The batch is this rank's share of the global batch at ``step`` (``None`` without a
        dataset). ``dataset`` is a map-style dataset (with ``batch_size``: the relay's own
        order) or a ``DataLoader`` over a ``DistributedSampler`` (its order, resumed at the
        step's batch of the step's epoch). A step whose collectives failed is dropped and
        yielded again after recovery, so the body must be the whole step: forward, backward,
        ``optimizer.step()``.

        ``start_step`` starts a fresh job at that step (a script resuming from its own
        snapshot: ``epochs_run * relay.steps_per_epoch``); every rank must pass the same one
        (checked at the first step). A spare ignores it: it resumes where its slot is. A job
        started by ``torchrelay run --resume`` loads its durable checkpoint of step ``S`` here
        and starts at ``S + 1`` (see :mod:`torchrelay.runtime.checkpoint`).
        """
        self.steps_per_epoch = epoch_length(dataset, batch_size, self.world_size)
        # The controller refuses any step claim beyond it (and a rank that disagrees).
        self._send(MaxSteps(max_steps=max_steps))
        fix_all_buckets(self.process_group)  # DDPs built over our group but not tracked
        if self.is_spare:
            if start_step:
                print(
                    f"torchrelay: a spare ignores start_step={start_step}: it resumes at its "
                    "slot's step with its slot's state (load no snapshot when relay.is_spare)",
                    file=sys.stderr,
                    flush=True,
                )
            self._await_assignment()
        else:  # a job resumed by `torchrelay run --resume` starts after its checkpoint
            resumed = resume_from_environ(self.rank, self.tracked, self.local)  # type: ignore[arg-type]
            self.committed = max(self.committed, start_step - 1, resumed)
        # Per rank this process feeds, and whether as its own; kept through recoveries.
        feeds: dict[tuple[int, bool], BatchFeed] = {}
        while True:
            step = self.committed + 1
            if step >= max_steps:
                if self._finish():
                    if self.checkpoints is not None:
                        self.checkpoints.close()
                    # The code after the loop runs once per process: a host is its lowest rank
                    # there, so rank-0-only work (the final save) runs on rank 0's host.
                    self.rank = min((self.rank, *self.hosted))  # type: ignore[type-var]
                    self.process_group.act_as(self.rank)  # type: ignore[arg-type]
                    return
                continue
            if self.guard.aborted:
                self._recover(in_flight=None)
                continue
            if dataset is not None:  # a recovery may have changed the ranks this process feeds
                assert self.rank is not None
                keys = [(self.rank, True), *((r, False) for r in self.hosted)]
                feeds = {
                    k: feeds.get(k) or self._feed(dataset, batch_size, collate_fn, *k) for k in keys
                }
                for feed in feeds.values():
                    feed.prepare(step)
            snapshot = self.tracked.snapshot()
            local_snapshot = None if self.local is None else self.local.snapshot()
            self.guard.begin_step()
            self.process_group.contributions.begin_step()
            self._current_step = step
            self.timer.start()
            for rank in self.hosted:
                yield from self._hosted_pass(step, rank, feeds.get((rank, False)), snapshot)
            seed_all(self.seed, step, self.rank)  # type: ignore[arg-type]
            yield step, (feeds[(self.rank, True)].at(step) if feeds else None)  # type: ignore[index]
            if not self.guard.poisoned:
                self.process_group.contributions.check_used()
            self._current_step = None
            if self.local is not None:
                self.local.exchange(self.process_group, self.device, step, self.generation)
            if self.guard.poisoned and not self.guard.optimizer_applied:
                self.timer.abandon()
                self.tracked.restore(snapshot)
                if self.local is not None:
                    self.local.restore(local_snapshot)
                    self.local.commit(False)
                for opt in self.tracked.optimizers():
                    opt.zero_grad(set_to_none=True)
                self._recover(in_flight=step)
                continue
            self.committed = step
            self._last_commit_t = time.time()
            if self.local is not None:
                self.local.commit(True)
            self.timer.commit(self.process_group.last_launch())
            self._share_layout()
            if self.checkpoints is not None:
                self.checkpoints.after_commit(step, self.rank, self.tracked, self.local)  # type: ignore[arg-type]
            self._report_resumed()
            if not self.guard.poisoned and self._agreement.due(self.generation):
                self._check_agreement(step)
            if self.guard.poisoned or self._handover_due():
                self._recover(in_flight=None)

    # ------------------------------------------------------------------ helpers
    def _feed(
        self,
        dataset: Any,
        batch_size: int | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        rank: int,
        own: bool,
    ) -> BatchFeed:
        """Rank ``rank``'s batches: this process's ``own``, or a hosted rank's."""
        if isinstance(dataset, DataLoader):
            return BatchFeed(
                lambda step: sampler_loader(dataset, rank, step, own=own),
                fetched_elsewhere=dataset.num_workers > 0,  # its workers fetch
            )
        assert batch_size is not None
        return BatchFeed(
            lambda step: step_loader(
                dataset, batch_size, self.world_size, rank, self.seed, step, collate_fn
            ),
            fetched_elsewhere=False,  # step_loader fetches in this process
        )

    def _hosted_pass(
        self, step: int, rank: int, feed: BatchFeed | None, snapshot: dict[str, Any]
    ) -> Iterator[tuple[int, Any]]:
        """Yield hosted ``rank``'s batch of ``step`` as that rank (its RNG, ``relay.rank``,
        ``dist.get_rank()``), its all-reduces kept for the own pass and its optimizer step
        skipped; the small tracked state it changed (an LR scheduler) is put back after it."""
        own = self.rank
        self.rank = rank
        self.process_group.act_as(rank)
        self.guard.accumulating = True
        self.process_group.contributions.start_pass()
        seed_all(self.seed, step, rank)
        try:
            yield step, (feed.at(step) if feed is not None else None)
        finally:
            self.process_group.contributions.end_pass()
            self.guard.accumulating = False
            self.rank = own
            self.process_group.act_as(own)  # type: ignore[arg-type]
        self.tracked.restore(snapshot)

    def _check_agreement(self, step: int) -> None:
        """Compare the replicated state across ranks (see :class:`AgreementCheck`)."""
        found = self._agreement.run(
            self.process_group,
            self.device,
            self.tracked.state(),
            step,
            complete=lambda: not self.guard.poisoned,
        )
        if found and self.rank == 0:
            self._warn(
                describe(found, step), what="replicated_state_differs", objects=tuple(sorted(found))
            )

    def _prepare_ddp(self, model: DistributedDataParallel) -> None:
        if model.process_group is not self.process_group:
            raise TrackingError(
                "build DDP with process_group=relay.process_group so it survives "
                "communicator changes"
            )
        fix_buckets(model, self.process_group)


def init(seed: int = 0) -> Relay:
    """Join the job this process was launched into by ``torchrelay run``.

    Seeds every RNG identically on all ranks (so models are built identically), picks the
    device (``relay.device``: this process's GPU with NCCL when CUDA is available, else the CPU
    with gloo; :mod:`devices`), opens the stable process group, starts the exit holder
    (:mod:`exit_holder`), has its stacks dumped before any fence (:mod:`stack_dump`), and
    returns the :class:`Relay` (on a spare at once: it waits for a slot in :meth:`Relay.steps`)."""
    relay = join(seed)
    exit_holder.start()
    return relay


def join(seed: int = 0) -> Relay:
    """:func:`init` without the exit holder: transparent mode's (CRIU cannot snapshot it)."""
    env = RelayEnv.from_environ()
    stack_dump.register()
    failover = failover_for(env.state, env.token)
    client = ControlClient(env.control, env.token, env.process, failover=failover)
    joined = client.join(env.role, host_pid(), env.node, env.rank, device=env.local_rank)
    relay = Relay(env, client, joined, seed)
    client.on_failover = relay._on_new_leader
    return relay
