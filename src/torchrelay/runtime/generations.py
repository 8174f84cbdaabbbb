"""Entering a generation: the rendezvous of its communicator, for the job's first
generation and for every plan's.

A mixin of :class:`torchrelay.runtime.relay.Relay` (through :class:`Recovery`); it relies on
the attributes that ``Relay.__init__`` sets (annotated below).

Members first meet on store keys, which an abort interrupts; gloo's own rendezvous, which
nothing interrupts, follows, bounded by ``JobConfig.rendezvous_timeout`` (see
:func:`torchrelay.runtime.devices.new_group`), so that a member dying inside it holds the others
only that long.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from torchrelay.runtime.devices import new_group
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import GenerationAborted, StepGuard
from torchrelay.runtime.hosting import comm_layout

KEY_POLL = datetime.timedelta(milliseconds=200)


class GenerationEntry:
    """Binds the stable process group to each generation's communicator (see above)."""

    device: Any
    world_size: int
    rank: int | None
    generation: int
    hosted: tuple[int, ...]
    guard: StepGuard
    process_group: StableProcessGroup
    _store: dist.TCPStore
    _timeout: datetime.timedelta
    _connect_within: datetime.timedelta  # JobConfig.rendezvous_timeout
    _retired: list[dist.ProcessGroup]
    # Called with a new slot (transparent mode's clone takes its samplers and RNG streams).
    on_slot: Callable[[int], None] | None

    def _bind(
        self,
        generation: int,
        rank: int,
        members: tuple[int, ...] | None = None,
        hosted: dict[int, int] | None = None,
        resuming: int | None = None,
    ) -> None:
        """Enter ``generation`` as ``rank``. ``members``: the ranks with a process of their
        own (default: all), in the order of the process group; ``hosted``: the others, each
        mapped to its host's rank (``--elastic``, see :mod:`torchrelay.runtime.hosting`);
        ``resuming``: the step the generation starts at (for chaos in its rendezvous)."""
        members = tuple(range(self.world_size)) if members is None else members
        hosted = {} if hosted is None else hosted
        self.guard.enter_generation(generation)
        moved = rank != self.rank
        self.generation, self.rank = generation, rank
        self.hosted = tuple(sorted(v for v, host in hosted.items() if host == rank))
        os.environ["RANK"] = os.environ["ROLE_RANK"] = str(rank)
        if moved and self.on_slot is not None:
            self.on_slot(rank)
        store = dist.PrefixStore(f"torchrelay/g{generation}", self._store)
        # Met on store keys first (see the module doc): a member dead by now aborts this.
        store.set(f"ready/{rank}", "1")
        self._await_keys(store, [f"ready/{r}" for r in members])
        self._maybe_fire("rendezvous", step=resuming)
        inner = new_group(
            store,
            members.index(rank),
            len(members),
            self._timeout,
            self.device,
            self._connect_within,
        )
        previous = self.process_group.bind(inner, rank, generation)
        self.process_group.set_layout(comm_layout(self.world_size, members, hosted))
        if previous is not None:
            # Destroying a gloo group joins its threads, which may sit in a collective that
            # will only time out: drop the last reference off the training thread.
            self._retired.append(previous)
            del previous
            threading.Thread(target=self._release_retired, daemon=True).start()

    def _first_bind(self) -> None:
        """Enter the job's first generation. If a peer is lost in its rendezvous, the
        controller aborts it: this rank then sets up without a communicator (the set-up's
        collectives are answered locally, see :mod:`torchrelay.runtime.facade`) and recovers
        at its first step. A failure no abort follows within the rendezvous bound is raised."""
        try:
            self._bind(self.generation, self.rank, resuming=0)  # type: ignore[arg-type]
        except RuntimeError:
            deadline = time.monotonic() + self._connect_within.total_seconds()
            while not self.guard.aborted:
                if time.monotonic() > deadline:
                    raise
                time.sleep(KEY_POLL.total_seconds())

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
