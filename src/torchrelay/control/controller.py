"""The controller: the single source of truth about a job's membership and recovery.

A thin shell around pure transitions. It holds the lock, the condition variable that waiters
re-check on every change, and two threads: the monitor (liveness, every interval) and the
recovery coordinator (:mod:`torchrelay.control.recovery_steps`, while a recovery is wanted).
Every entry point takes the lock, runs a transition over the plain :class:`JobState`, hands the
resulting actions to the :class:`Executor` and wakes the waiters. Steady-state training never
waits on it: workers only report progress asynchronously.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torchrelay.chaos import ChaosEvent
from torchrelay.config import JobConfig
from torchrelay.control import (
    departures,
    drills,
    endings,
    liveness,
    membership,
    nodes,
    takeover,
    transparent,
)
from torchrelay.control.actions import Action, Refused
from torchrelay.control.coordinator import Coordinator
from torchrelay.control.errors import FencedError, ProtocolError
from torchrelay.control.executor import AgentHandle, Executor
from torchrelay.control.health_intake import HealthIntake
from torchrelay.control.job_view import describe_job
from torchrelay.control.operator_side import OperatorSide
from torchrelay.control.outbox import Outbox
from torchrelay.control.persistence import StatePersister, relearnt
from torchrelay.control.pool_side import PoolSide
from torchrelay.control.protocol import (
    CopyOutcome,
    HealthReport,
    JoinAnswer,
    JoinRequest,
    Lease,
    NodeJoinAnswer,
    NodeReport,
    Progress,
    Report,
)
from torchrelay.control.rejections import Rejections
from torchrelay.control.state import GONE, JobState, Member, MemberState, NodeEntry
from torchrelay.control.store import StoreError
from torchrelay.control.verdicts import describe_exit, last_traceback
from torchrelay.events import Event
from torchrelay.ledger import Ledger

__all__ = ["AgentHandle", "Controller", "FencedError", "ProtocolError"]


@dataclass
class Waking:
    """Whether a transition wakes the controller's waiters (set by the transition)."""

    waiters: bool = True


class Controller(Coordinator, PoolSide, OperatorSide):
    """Membership, generations and recovery for one job (see DESIGN.md, invariants 1-6)."""

    def __init__(
        self,
        config: JobConfig,
        ledger: Ledger,
        agent: AgentHandle,
        local_node: str = "node0",
        persister: StatePersister | None = None,
        job: JobState | None = None,
        observe: Callable[[Event], None] | None = None,
    ) -> None:
        """A new job's controller on ``local_node``, or -- given the restored ``job`` -- a
        standby's that takes it over (then call :meth:`take_over` before serving)."""
        self.config = config
        self.ledger = ledger
        self.agent = agent
        self.job = job or JobState(
            local_node=local_node,
            leader_node=local_node,
            hang_timeout=config.hang_floor,
            chaos_pending={e.id: e for e in config.chaos},
            spares_launching={local_node: config.spares},
        )
        # Control requests refused before they reached the controller (counted by the server).
        self.rejections = Rejections(ledger)
        self._executor = Executor(
            ledger, agent, self.rejections, self._kick_recovery, observe, self._copied
        )
        self._cond = threading.Condition()
        self._recovery_thread: threading.Thread | None = None
        # Set once the durable state could not be written: from then on nothing is acted on
        # but the end of the job (see control.persistence).
        self._persister = persister
        self._store_lost: str | None = None
        self._health = HealthIntake(config.health_policy, config.world_size)

    # ---------------------------------------------------------------- state, read-only views
    @property
    def members(self) -> dict[str, Member]:
        return self.job.members

    @property
    def nodes(self) -> dict[str, NodeEntry]:
        return self.job.nodes

    @property
    def generation(self) -> int:
        return self.job.generation

    @property
    def outcome(self) -> dict[str, Any] | None:
        return self.job.outcome

    @property
    def finished(self) -> bool:
        return self.job.finished

    @property
    def chaos_pending(self) -> dict[int, ChaosEvent]:
        return self.job.chaos_pending

    @chaos_pending.setter
    def chaos_pending(self, events: dict[int, ChaosEvent]) -> None:
        with self._cond:
            self.job.chaos_pending = events

    def outbox(self, process: str) -> Outbox:
        """The message stream of ``process`` (what :meth:`watch` serves)."""
        return self._executor.outbox(process)

    def node_outbox(self, node: str) -> Outbox:
        """The command stream of node agent ``node`` (what :meth:`watch_node` serves)."""
        return self._executor.node_outbox(node)

    def hang_timeout(self) -> float:
        """Heartbeat silence that means a hang: a multiple of the job's median step time."""
        with self._cond:
            return liveness.hang_timeout(self.job, self.config)

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate()`` holds under the controller's lock: re-checked after
        each transition, and at least at every monitor tick (a heartbeat that decides nothing
        wakes no waiter, see :func:`membership.wakes`)."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def joined(self) -> set[str]:
        """Every process that joined the job, gone or not."""
        with self._cond:
            return set(self.job.members)

    def wait_all_gone(self, timeout: float) -> bool:
        """Wait until every process of the job exited, no spare is on its way (its node's
        agent must report its exit before the controller stops serving) and every live node's
        stream has taken its ``finish`` (stopping sooner cuts the stream, and the node takes
        the job for lost: seen under load once its slots had been drained); ``False`` if that
        has not all happened within ``timeout`` in all."""
        deadline = time.monotonic() + timeout

        def gone() -> bool:
            job = self.job
            settled = not any(job.spares_launching.values())
            return settled and all(m.state in GONE for m in job.members.values())

        if not self.wait_until(gone, timeout):
            return False
        with self._cond:
            live = [self._executor.node_outbox(n) for n, e in self.job.nodes.items() if e.alive]
        return all(outbox.wait_drained(max(0.0, deadline - time.monotonic())) for outbox in live)

    def wait_finished(self, timeout: float | None = None) -> dict[str, Any] | None:
        with self._cond:
            self._cond.wait_for(lambda: self.job.finished, timeout)
            return self.job.outcome

    def status(self) -> dict[str, Any]:
        """A snapshot of the job for operators (``torchrelay status``, ``torchrelay chaos``)."""
        with self._cond:
            return describe_job(self.job, self.config, self.rejections.counts(), time.time())

    # ---------------------------------------------------------------- transitions
    @contextmanager
    def _transition(self) -> Iterator[Waking]:
        """Hold the lock around one transition; wake every waiter after it, refused or not,
        unless the transition sets ``waiters`` of what it is given to ``False``."""
        waking = Waking()
        with self._cond:
            try:
                yield waking
            except Refused as refused:
                self._executor.apply(refused.actions)
                raise refused.error from None
            finally:
                if waking.waiters:
                    self._cond.notify_all()

    def _apply(self, actions: list[Action], unless_acting: bool = False) -> None:
        """Carry out ``actions`` once the state that decided them is durable (with a state
        store); if it cannot be written, end the job instead of acting on it.
        ``unless_acting``: the transition changed only what a successor learns or decides
        again (see :func:`persistence.relearnt`), so the state is written only if it acts."""
        persister = self._persister if self._store_lost is None else None
        if persister is not None and (actions or not unless_acting):
            try:
                persister.save(self.job)
            except StoreError as exc:
                self._lose_store(str(exc))
                return
        self._executor.apply(actions)

    def _lose_store(self, problem: str) -> None:
        """End the job, unrecorded: another controller may lead now (called with the lock)."""
        self._store_lost = problem
        reason = (
            f"the job state could not be recorded ({problem}); the job stops rather than act "
            "on decisions another controller may not know of"
        )
        self._executor.apply(endings.fail(self.job, reason))

    def _output_tail(self, process: str) -> str:
        """The last traceback (or lines) its agent logged for ``process``; the agent reports
        an exit only after its output is written. Empty for a remote node's process whose log
        is not on this machine."""
        path = self.config.run_dir / "logs" / f"{process}.log"
        try:
            with path.open("rb") as log:
                log.seek(max(0, path.stat().st_size - 65536))
                return last_traceback(log.read().decode(errors="replace"))
        except OSError:
            return ""

    def stop(self, reason: str) -> None:
        """End the job as failed with ``reason`` (launcher shutdown)."""
        with self._transition():
            self._apply(endings.fail(self.job, reason))

    def terminate(self, signal_name: str) -> None:
        """End the job as ``terminated``: stopped from outside (a scheduler's SIGTERM, a
        Ctrl-C), not failed. Exits seen from now on are the stop itself, not failures."""
        with self._transition():
            self._apply(endings.terminate(self.job, signal_name))

    def take_over(self, leader: str, term: int, control: str, store: str) -> None:
        """Lead the restored job from node ``leader`` (see :mod:`torchrelay.control.takeover`)."""
        with self._transition():
            now = time.time()
            self._apply(
                takeover.take_over(
                    self.job, self.config, leader, term, control, store, now, self._output_tail
                )
            )

    def join(self, process: str, request: JoinRequest) -> JoinAnswer:
        """Register a process; workers name their slot, spares get one later."""
        with self._transition():
            job = self.job
            self._apply(membership.join(job, self.config, process, request, time.time()))
            return JoinAnswer(
                world_size=self.config.world_size,
                generation=job.members[process].generation,
                chaos=tuple(drills.chaos_for(job, request.slot)),
                collective_timeout=self.config.collective_timeout,
                rendezvous_timeout=self.config.rendezvous_timeout,
            )

    def watch(self, process: str) -> tuple[Outbox, Callable[[], bool]]:
        """The outbox of ``process`` (abort, plan, finish messages, in order) and a test that
        says its stream may end once the outbox is empty: the process is dead or fenced."""
        with self._cond:
            member = self.job.member(process)
            outbox = self._executor.outbox(process)
        return outbox, lambda: member.state in GONE or member.state is MemberState.RETIRED

    def report(self, process: str, message: Report) -> Lease | None:
        """Handle one report from a process (see :func:`membership.report`); a ``progress``
        report is answered with the worker's lease, the hang timeout (it stops on its own if
        it cannot get a heartbeat through)."""
        with self._transition() as waking:
            again = relearnt(self.job, message)
            actions = membership.report(self.job, process, message, time.time())
            self._apply(actions, again)
            waking.waiters = membership.wakes(message, actions)
            if isinstance(message, Progress):
                return Lease(hang_timeout=self.job.hang_timeout)
            return None

    def _copied(self, event: Event) -> None:
        """The local node agent's outcome of a transparent copy (see control.transparent)."""
        with self._transition():
            self._apply(transparent.copied(self.job, event, self.job.local_node))

    def on_exit(self, process: str, returncode: int) -> None:
        """The agent saw ``process`` exit with ``returncode`` (negative: killed by a signal)."""
        with self._transition():
            cause = describe_exit(returncode)
            self._apply(
                departures.on_exit(
                    self.job,
                    self.config,
                    process,
                    returncode,
                    cause,
                    time.time(),
                    self._output_tail,
                )
            )

    # ---------------------------------------------------------------- nodes
    def join_node(self, node: str) -> NodeJoinAnswer:
        """A remote node agent registers; it will watch :meth:`watch_node` for commands."""
        with self._transition():
            actions = nodes.join_node(self.job, node, time.time())
            self._executor.open_node(node)
            self._apply(actions)
            return NodeJoinAnswer(
                world_size=self.config.world_size, node_timeout=self.config.node_timeout
            )

    def watch_node(self, node: str) -> tuple[Outbox, Callable[[], bool]]:
        """The outbox of commands for a node agent (start_spare, signal, chaos, finish) and a
        test that says its stream must end: the node was declared lost.

        A node cut off by the network may keep its stream open for minutes: its heartbeats
        stopping is what declares it lost then, and that also ends the stream.
        """
        with self._cond:
            entry = nodes.node_of(self.job, node)
            outbox = self._executor.node_outbox(node)
        return outbox, lambda: not entry.alive

    def node_stream_closed(self, node: str) -> None:
        """The agent's command stream ended without ``finish``: the agent died, so every
        process of that node is declared lost in one go."""
        with self._transition():
            nodes.node_of(self.job, node)
            reason = "its agent's connection closed"
            self._apply(
                departures.node_lost(
                    self.job, self.config, node, reason, time.time(), self._output_tail
                )
            )

    def node_report(self, node: str, report: NodeReport) -> None:
        """A remote agent's heartbeat, a process exit it saw, the start of a chaos drill (see
        :func:`departures.node_report`), or the outcome of a copy (:func:`transparent.copied`)."""
        with self._transition():
            now, again = time.time(), relearnt(self.job, report)
            actions = departures.node_report(
                self.job, self.config, node, report, now, self._output_tail
            )
            if isinstance(report, HealthReport):
                actions += self._health.readings(self.job, node, report.readings, now)
            if isinstance(report, CopyOutcome):
                actions += transparent.copied(self.job, report.outcome(), node)
            self._apply(actions, again)

    def health(self, node: str, readings: tuple[dict[str, Any], ...]) -> None:
        """One poll of the health readings of the controller's own node (see
        :mod:`torchrelay.control.health_intake`)."""
        with self._transition():
            self._apply(self._health.readings(self.job, node, readings, time.time()))
