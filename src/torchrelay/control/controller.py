"""The controller: the single source of truth about a job's membership and recovery.

It receives reports (process joined, step committed, step halted, recovery phase done, user
exception, process exited), decides with the pure planner, publishes plans to the processes'
watch streams, and writes every event to the ledger. Steady-state training never waits on it:
workers only report progress asynchronously.
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from torchrelay.chaos import NODE_ACTIONS, ChaosEvent
from torchrelay.config import JobConfig
from torchrelay.control.claims import claimed_step, judge_claim, judge_max_steps
from torchrelay.control.detection import Beat, judge
from torchrelay.control.outbox import Outbox
from torchrelay.control.planner import (
    PlanningError,
    RecoveryPlan,
    Spare,
    choose_replacements,
    plan_recovery,
)
from torchrelay.control.rejections import Rejections
from torchrelay.control.verdicts import (
    after_loop_reason,
    describe_exit,
    fails_before_first_step,
    finish_verdict,
    first_step_bug_reason,
    last_traceback,
    missing_spares,
    never_joined,
    no_spare_reason,
    overdue_reason,
    recovery_deadline,
    spare_node,
    step_in_flight,
    survivor_gaps,
    unjoined_failure,
)
from torchrelay.exits import SELF_FENCED
from torchrelay.ledger import Ledger

PROCESS_FAULTS = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}
# A heartbeat younger than this vouches for a live process (heartbeats go out every 0.5 s).
FRESH_HEARTBEAT = 2.0


class FencedError(RuntimeError):
    """A process of an older generation tried to take part in a newer one."""


class ProtocolError(ValueError):
    """A well-authenticated message that makes no sense for the job's current state."""


class AgentHandle(Protocol):
    """What the controller needs from the node agent(s)."""

    def start_spare(self) -> None: ...

    def kill(self, process: str, signum: int = signal.SIGKILL) -> None: ...


@dataclass
class Member:
    """One process known to the controller."""

    process: str
    role: str
    node: str
    pid: int
    slot: int | None = None
    generation: int = -1
    state: str = "starting"
    committed: int = -1
    valid: bool = True
    last_seen: float = field(default_factory=time.time)
    timings: dict[str, float] = field(default_factory=dict)
    step_age: float | None = None
    waiting: float | None = None
    busy: bool = False
    detection: str = "exit"
    detected_by: str = "process exit (waitpid)"
    error: dict[str, Any] | None = None
    # Highest step claimed per report channel (see control.claims); cleared on a receiver.
    claims: dict[str, int] = field(default_factory=dict)
    returncode: int | None = None
    last_commit_t: float | None = None  # wall time of its last commit, from its halted report
    outbox: Outbox = field(default_factory=Outbox)


@dataclass
class Node:
    """A remote node agent, reached through the commands it watches; it heartbeats."""

    name: str
    outbox: Outbox = field(default_factory=Outbox)
    alive: bool = True
    last_seen: float = field(default_factory=time.time)
    chaos_notice: dict[str, Any] | None = None


@dataclass
class Recovery:
    """Timeline of one recovery, filled as the phases complete."""

    failures: list[dict[str, Any]]
    detected: float
    plan: RecoveryPlan | None = None
    spare_ready: float = 0.0
    halted: float = 0.0
    planned: float = 0.0
    phases: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    in_flight: set[int] = field(default_factory=set)


class Controller:
    """Membership, generations and recovery for one job (see DESIGN.md, invariants 1-6)."""

    def __init__(
        self, config: JobConfig, ledger: Ledger, agent: AgentHandle, local_node: str = "node0"
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.agent = agent
        self.local_node = local_node
        self.nodes: dict[str, Node] = {}
        self.generation = 0
        self.assignments: dict[int, str] = {}
        self.members: dict[str, Member] = {}
        self.chaos_pending: dict[int, ChaosEvent] = {e.id: e for e in config.chaos}
        self.highest_committed = -1
        self.max_steps: int | None = None  # declared by the workers (Relay.steps)
        self.bug_restarts = 0
        self.spare_failures = 0
        self.outcome: dict[str, Any] | None = None
        self.stragglers: dict[str, dict[str, Any]] = {}
        # Control requests refused before they reached the controller (counted by the server).
        self.rejections = Rejections(ledger)
        self._cond = threading.Condition()
        self._failed: dict[int, dict[str, Any]] = {}
        self._reform: dict[str, Any] | None = None
        self._reforms_at: tuple[int, int] = (-1, 0)
        self._hang_timeout = config.hang_floor
        self._replan: str | None = None
        self._carried: Recovery | None = None
        self._replans = 0
        self._recovery: Recovery | None = None
        self._recovery_thread: threading.Thread | None = None
        # Every slot finished its last step; success waits for their processes to exit 0.
        self._finishing = False
        # Spare processes started on each node that have neither joined nor exited yet.
        self._spares_launching: dict[str, int] = {local_node: config.spares}

    # ---------------------------------------------------------------- queries
    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate()`` holds under the controller's lock (re-checked on change)."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def wait_finished(self, timeout: float | None = None) -> dict[str, Any] | None:
        with self._cond:
            self._cond.wait_for(lambda: self.outcome is not None, timeout)
            return self.outcome

    def status(self) -> dict[str, Any]:
        """A snapshot of the job for operators (``torchrelay status``, ``torchrelay chaos``)."""
        with self._cond:

            def describe(m: Member) -> dict[str, Any]:
                return {
                    "process": m.process,
                    "pid": m.pid,
                    "node": m.node,
                    "role": m.role,
                    "slot": m.slot,
                    "state": m.state,
                    "committed": m.committed,
                    "seconds_since_heartbeat": time.time() - m.last_seen,
                    **m.timings,
                }

            return {
                "generation": self.generation,
                "world_size": self.config.world_size,
                "slots": [describe(self.members[p]) for _, p in sorted(self.assignments.items())],
                "spares": [
                    describe(m)
                    for m in self.members.values()
                    if m.role == "spare" and m.slot is None and m.state in ("starting", "ready")
                ],
                "steps_committed": self.highest_committed + 1,
                "recovering": self._recovery is not None,
                "hang_timeout": self._hang_timeout,
                "nodes": {
                    n.name: {"alive": n.alive, "seconds_since_heartbeat": time.time() - n.last_seen}
                    for n in self.nodes.values()
                },
                "stragglers": list(self.stragglers.values()),
                "rejected_requests": self.rejections.counts(),
                "outcome": self.outcome,
            }

    def stop(self, reason: str) -> None:
        """End the job as failed with ``reason`` (launcher shutdown)."""
        with self._cond:
            self._fail(reason)

    def terminate(self, signal_name: str) -> None:
        """End the job as ``terminated``: stopped from outside (a scheduler's SIGTERM, a
        Ctrl-C), not failed. Exits seen from now on are the stop itself, not failures."""
        with self._cond:
            if self.outcome is None:
                self._end(
                    "terminated",
                    signal=signal_name,
                    reason="stopped from outside (a scheduler, an operator or Ctrl-C); "
                    "workers and spares were stopped",
                )

    # ---------------------------------------------------------------- reports
    def join(self, process: str, role: str, pid: int, node: str, slot: int | None) -> dict:
        """Register a process; workers name their slot, spares get one later."""
        if role not in ("worker", "spare"):
            raise ProtocolError(f"unknown role {role!r}")
        with self._cond:
            if process in self.members:
                raise ProtocolError(f"process {process!r} joined twice")
            member = Member(process, role, node, pid)
            if role == "worker":
                if slot is None or not 0 <= slot < self.config.world_size:
                    raise ProtocolError(f"worker slot {slot!r} outside world size")
                if self.generation != 0 or slot in self.assignments:
                    raise FencedError(
                        f"slot {slot} is already filled in generation {self.generation}; "
                        "a worker can only join at job start"
                    )
                member.slot, member.generation, member.state = slot, 0, "active"
                self.assignments[slot] = process
            self.members[process] = member
            if role == "spare":
                self._spare_accounted(node)
            if self.finished or self._finishing:
                # A refill spare that comes up after the job ended must not wait forever.
                member.outbox.put({"type": "finish"})
            self.ledger.record(
                "process_join", process=process, role=role, slot=slot, pid=pid, node=node
            )
            return {
                "world_size": self.config.world_size,
                "generation": member.generation,
                "chaos": self._chaos_for(slot),
                "collective_timeout": self.config.collective_timeout,
            }

    def _chaos_for(self, slot: int | None) -> list[dict[str, Any]]:
        if slot is None:
            return []
        return [e.to_dict() for e in self.chaos_pending.values() if e.rank == slot]

    def watch(self, process: str) -> tuple[Outbox, Callable[[], bool]]:
        """The outbox of ``process`` (abort, plan, finish messages, in order) and a test that
        says its stream may end once the outbox is empty: the process is dead or fenced."""
        with self._cond:
            member = self._member(process)
        return member.outbox, lambda: member.state in ("dead", "fenced")

    def report(self, process: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """Handle one report from a process.

        Every report is fenced: one from a dead, fenced or superseded member raises
        :class:`FencedError`. A step claim that does not fit the plan (see
        :mod:`torchrelay.control.claims`) raises :class:`ProtocolError`, as does a ``max_steps``
        that differs from the job's; both refusals are recorded in the ledger.
        """
        handler = {
            "max_steps": self._on_max_steps,
            "progress": self._on_progress,
            "ready": self._on_ready,
            "halted": self._on_halted,
            "phase": self._on_phase,
            "done": self._on_done,
            "error": self._on_error,
            "chaos_fired": self._on_chaos_fired,
            "warning": self._on_warning,
        }.get(kind)
        if handler is None:
            raise ProtocolError(f"unknown report kind {kind!r}")
        with self._cond:
            member = self._member(process)
            self._check_fence(member, body)
            self._check_claim(member, kind, body)
            member.last_seen = time.time()
            result = handler(member, body) or {}
            self._cond.notify_all()
            return result

    def _member(self, process: str) -> Member:
        member = self.members.get(process)
        if member is None:
            raise ProtocolError(f"unknown process {process!r}: it never joined this job")
        return member

    def _check_fence(self, member: Member, body: dict[str, Any]) -> None:
        generation = body.get("generation", member.generation)
        stale = member.state in ("dead", "fenced") or (
            member.role == "worker"
            and isinstance(generation, int)
            and generation < self.generation
            and member.generation < self.generation
        )
        if stale:
            self.ledger.record(
                "fenced_refused",
                process=member.process,
                slot=member.slot,
                generation=generation,
                current_generation=self.generation,
            )
            raise FencedError(
                f"process {member.process} (slot {member.slot}, generation {generation}) was "
                f"fenced out; the job is at generation {self.generation}"
            )

    def _check_claim(self, member: Member, kind: str, body: dict[str, Any]) -> None:
        claim = claimed_step(kind, body)
        if claim is None:
            return
        channel, step = claim
        # A report of an older generation still in flight is checked against the plan only.
        current = body.get("generation") == member.generation
        floor = member.claims.get(channel) if current else None
        reason = judge_claim(kind, step, self.max_steps, floor)
        if reason is not None:
            self._refuse(member, kind, reason)
        if current:
            member.claims[channel] = max(step, -1 if floor is None else floor)

    def _refuse(self, member: Member, kind: str, reason: str) -> None:
        self.ledger.record("claim_refused", process=member.process, kind=kind, reason=reason)
        raise ProtocolError(f"{member.process}: {reason}")

    def _on_max_steps(self, member: Member, body: dict[str, Any]) -> None:
        reason = judge_max_steps(body.get("max_steps"), self.max_steps)
        if reason is not None:
            self._refuse(member, "max_steps", reason)
        self.max_steps = int(body["max_steps"])

    def _on_progress(self, member: Member, body: dict[str, Any]) -> dict[str, Any]:
        for key in ("step_seconds", "compute_seconds"):
            if key in body:
                member.timings[key] = float(body[key])
        if "step_age" in body:
            member.step_age = _seconds(body["step_age"])
            member.waiting = _seconds(body.get("waiting"))
            member.busy = body.get("busy") is not None
        step = int(body["step"])
        member.committed = max(member.committed, step)
        if step > self.highest_committed:
            self.highest_committed = step
            self._fire_node_chaos()
        recovery = self._recovery
        if (
            body.get("first_after_recovery")
            and recovery is not None
            and recovery.plan is not None
            and body.get("generation") == recovery.plan.generation
        ):
            self._phase_done(recovery, member, "first_step", body)
        # The worker's lease: it stops on its own if it cannot get a heartbeat through.
        return {"hang_timeout": self._hang_timeout}

    def _on_ready(self, member: Member, body: dict[str, Any]) -> None:
        if member.role != "spare" or member.state != "starting":
            raise ProtocolError(f"{member.process} reported ready but is {member.state}")
        member.state = "ready"
        self.ledger.record("spare_ready", process=member.process)

    def _on_halted(self, member: Member, body: dict[str, Any]) -> None:
        member.committed = int(body["committed"])
        if body.get("last_commit_t") is not None:
            member.last_commit_t = float(body["last_commit_t"])
        member.valid = bool(body.get("valid", True))
        member.state = "halted"
        recovery = self._recovery
        if (
            recovery is not None
            and recovery.plan is not None
            and body.get("generation") == (recovery.plan.generation)
        ):
            # A member could not complete the published plan (its transfer failed or was
            # aborted): plan again with what is alive.
            self._replan = str(body.get("reason", "a member could not enter the generation"))
            self.ledger.record(
                "recovery_failed",
                process=member.process,
                slot=member.slot,
                generation=recovery.plan.generation,
                reason=self._replan,
            )
        if self._recovery is not None and body.get("in_flight") is not None:
            self._recovery.in_flight.add(int(body["in_flight"]))
        self.highest_committed = max(self.highest_committed, member.committed)

    def _on_phase(self, member: Member, body: dict[str, Any]) -> None:
        recovery = self._recovery
        if recovery is None or recovery.plan is None:
            raise ProtocolError("phase report outside of a recovery")
        self._phase_done(recovery, member, str(body["phase"]), body)

    def _on_done(self, member: Member, body: dict[str, Any]) -> None:
        member.state = "done"
        member.committed = int(body["step"])
        self.highest_committed = max(self.highest_committed, member.committed)
        if self._failed or self._recovery is not None:
            return
        if all(m.state == "done" for m in self._slot_members()):
            self._finish_training()

    def _on_error(self, member: Member, body: dict[str, Any]) -> None:
        member.error = {"step": body.get("step"), "traceback": str(body.get("traceback", ""))}

    def _on_chaos_fired(self, member: Member, body: dict[str, Any]) -> None:
        event = self.chaos_pending.pop(int(body["id"]), None)
        if event is not None:
            self.ledger.record("chaos_fired", process=member.process, **event.to_dict())

    def _on_warning(self, member: Member, body: dict[str, Any]) -> None:
        # A worker's finding about the user's state (see runtime/replicas.py): kept, not acted on.
        objects = body.get("objects")
        self.ledger.record(
            "warning",
            process=member.process,
            slot=member.slot,
            step=body.get("step"),
            what=str(body.get("what", ""))[:64],
            objects=[str(o)[:64] for o in objects][:32] if isinstance(objects, list) else [],
            message=str(body.get("message", ""))[:2000],
        )

    # ---------------------------------------------------------------- exits
    def on_exit(self, process: str, returncode: int) -> None:
        """The agent saw ``process`` exit with ``returncode`` (negative: killed by a signal)."""
        with self._cond:
            self._on_exit_locked(process, returncode, describe_exit(returncode))

    def _on_exit_locked(self, process: str, returncode: int, cause: str) -> None:
        self._cond.notify_all()  # waiters re-check once the lock is released
        member = self.members.get(process)
        if member is None:
            self.ledger.record(
                "process_exit",
                process=process,
                returncode=returncode,
                note="exited before joining",
            )
            if not (self.finished or self._finishing):
                self._on_early_exit(process, returncode)
            return
        was = member.state
        self.ledger.record(
            "process_exit",
            process=process,
            slot=member.slot,
            returncode=returncode,
            cause=cause,
            state=was,
        )
        if was == "fenced":
            return  # its node was declared lost: its slot was handled then
        member.state, member.returncode = "dead", returncode
        if self._finishing and not self.finished:
            self._on_exit_after_training(member)
            return
        if self.finished or (was == "done" and returncode == 0):
            return
        if member.slot is None or self.assignments.get(member.slot) != process:
            self._on_spare_lost(member, cause)
            return
        self._on_worker_lost(member, returncode, cause)
        self._cond.notify_all()

    def _on_early_exit(self, process: str, returncode: int) -> None:
        """A process died before it could even join: a broken script or environment (stop at
        once, see :func:`never_joined`), or a spare killed from outside (start another)."""
        output = self._output_tail(process)
        failure = unjoined_failure(process, returncode, output)
        if failure is not None:
            now = time.time()
            self.ledger.record("failure", **failure, generation=self.generation, t=now, onset=now)
        reason = never_joined(process, returncode, output)
        if reason is not None:
            self._fail(reason, traceback=output or None)
            return
        self._spare_accounted(spare_node(process, self.local_node))
        self.spare_failures += 1
        if self.spare_failures > self.config.max_restarts:
            self._fail(
                f"spares keep being killed before they join the job ({process}: "
                f"{describe_exit(returncode)}); see RUN_DIR/logs/{process}.log",
            )
            return
        self._start_spare()

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

    def _on_exit_after_training(self, member: Member) -> None:
        """Once every slot finished its last step, the job succeeds only when all their
        processes exit with 0: a failure in the script's final work (saving) fails it."""
        if member.slot is None or self.assignments.get(member.slot) != member.process:
            return  # a spare leaving at the end
        verdict, slot = finish_verdict({m.slot: m.returncode for m in self._slot_members()})
        if verdict == "succeeded":
            self._succeed()
        elif verdict == "failed":
            failed = self.members[self.assignments[slot]]  # type: ignore[index]
            self._fail(
                after_loop_reason(slot, failed.process, failed.returncode),  # type: ignore[arg-type]
                traceback=(failed.error or {}).get("traceback")
                or self._output_tail(failed.process)
                or None,
            )

    def _on_spare_lost(self, member: Member, cause: str) -> None:
        self.spare_failures += 1
        self.ledger.record(
            "spare_lost",
            process=member.process,
            cause=cause,
            traceback=(member.error or {}).get("traceback"),
        )
        if member.error is not None and self.spare_failures > self.config.max_restarts:
            self._fail(
                f"spares keep failing during setup (last: {member.process}, {cause}); "
                "this is a bug in the script, not a hardware failure",
                traceback=member.error["traceback"],
            )
            return
        self._start_spare()

    def _on_worker_lost(self, member: Member, returncode: int, cause: str) -> None:
        assert member.slot is not None
        kind = _failure_kind(member, returncode)
        if kind == "stall":
            cause = f"a stall (fenced with {cause})"
        failure = {
            "slot": member.slot,
            "process": member.process,
            "last_reported_step": member.committed,
            "cause": cause,
            "kind": kind,
            "detected_by": member.detected_by,
            "generation": self.generation,
            "t": time.time(),
            # When it really stopped working: its last sign of life for a hang.
            "onset": _onset(member),
        }
        if member.error is not None:
            failure["traceback"] = member.error["traceback"]
        step = step_in_flight(
            max(member.committed, self.highest_committed), (member.error or {}).get("step")
        )
        failure["step"] = step
        self.ledger.record("failure", **failure)
        if fails_before_first_step(kind, self.highest_committed):
            self._fail(
                first_step_bug_reason(member.slot, member.process, step, cause),
                traceback=failure.get("traceback") or self._output_tail(member.process) or None,
            )
            return
        if kind in ("exception", "exit", "stall"):
            self.bug_restarts += 1
            if self.bug_restarts > self.config.max_restarts:
                self._fail(
                    f"rank {member.slot} failed {self.bug_restarts} times (last: {cause} in "
                    f"step {step}; max restarts {self.config.max_restarts}); "
                    "this looks like a bug in the script, not a hardware failure",
                    traceback=failure.get("traceback"),
                )
                return
        self._failed[member.slot] = failure
        self._kick_recovery()

    def _kick_recovery(self) -> None:
        if self._recovery_thread is None:
            self._recovery_thread = threading.Thread(
                target=self._recover_loop, name="torchrelay-recovery", daemon=True
            )
            self._recovery_thread.start()

    # ---------------------------------------------------------------- nodes
    def join_node(self, node: str) -> dict[str, Any]:
        """A remote node agent registers; it will watch :meth:`watch_node` for commands."""
        with self._cond:
            if node == self.local_node or (node in self.nodes and self.nodes[node].alive):
                raise ProtocolError(f"node {node!r} is already part of the job")
            self.nodes[node] = Node(node)
            self.ledger.record("node_join", node=node)
            return {"world_size": self.config.world_size, "node_timeout": self.config.node_timeout}

    def watch_node(self, node: str) -> tuple[Outbox, Callable[[], bool]]:
        """The outbox of commands for a node agent (start_spare, signal, chaos, finish) and a
        test that says its stream must end: the node was declared lost.

        A node cut off by the network may keep its stream open for minutes: its heartbeats
        stopping is what declares it lost then, and that also ends the stream.
        """
        entry = self._node(node)
        return entry.outbox, lambda: not entry.alive

    def node_stream_closed(self, node: str) -> None:
        """The agent's command stream ended without ``finish``: the agent died, so every
        process of that node is declared lost in one go."""
        entry = self._node(node)
        with self._cond:
            self._node_lost(entry, "its agent's connection closed")
            self._cond.notify_all()

    def node_report(self, node: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """A remote agent's heartbeat, a process exit it saw, or the start of a chaos drill.

        Raises :class:`FencedError` once the node was declared lost: its agent must stop its
        workers instead of bringing stale replicas back.
        """
        entry = self._node(node)
        with self._cond:
            if not entry.alive:
                self.ledger.record("fenced_refused", node=node, kind=kind)
                raise FencedError(
                    f"node {node} was declared lost ({entry.name} unheard of for more than "
                    f"{self.config.node_timeout:.0f} s); its slots were handed to others"
                )
            entry.last_seen = time.time()
            if kind == "exit":
                self._on_exit_locked(
                    str(body["exited"]),
                    int(body["returncode"]),
                    describe_exit(int(body["returncode"])),
                )
            elif kind == "chaos":
                details = {k: v for k, v in body.items() if k not in ("node", "kind", "process")}
                self.ledger.record("chaos_injected", node=node, **details)
                entry.chaos_notice = details
                self._cond.notify_all()
            elif kind != "heartbeat":
                raise ProtocolError(f"unknown node report kind {kind!r}")
            return {}

    def inject(self, fault: str, target: str, seconds: float = 0.0) -> dict[str, Any]:
        """An operator's drill (``torchrelay chaos``), carried out by the target's node agent.

        ``kill`` and ``hang`` send SIGKILL / SIGSTOP to the process ``target``; ``partition``
        and ``kill-node`` act on the node ``target``. The controller's own node is refused
        for those, since losing it ends the job (the controller is not replicated).
        """
        if fault in PROCESS_FAULTS:
            with self._cond:
                member = self._member(target)
                if member.state in ("dead", "fenced"):
                    raise ProtocolError(f"{target} is not running ({member.state})")
                self.ledger.record("chaos_requested", fault=fault, process=target)
                self._signal(target, PROCESS_FAULTS[fault])
                return {"process": target, "node": member.node, "pid": member.pid}
        if fault not in NODE_ACTIONS:
            raise ProtocolError(f"unknown fault {fault!r}")
        node = target
        if node == self.local_node:
            raise ProtocolError(
                f"{node} hosts the controller: cutting or killing it ends the job, there is "
                "nothing to recover to; drill another node"
            )
        entry = self._node(node)
        with self._cond:
            if not entry.alive:
                raise ProtocolError(f"{node} is already lost")
            if fault == "partition" and not 1.0 <= seconds <= 3600.0:
                raise ProtocolError("a partition lasts between 1 and 3600 seconds")
            entry.chaos_notice = None
            self._send_node_fault(entry, fault, seconds)
            # The agent says what it does (or why it cannot) before doing it.
            self._cond.wait_for(lambda: entry.chaos_notice is not None, timeout=10.0)
            return {
                "node": node,
                "fault": fault,
                "node_timeout": self.config.node_timeout,
                "notice": entry.chaos_notice,
            }

    def _send_node_fault(self, entry: Node, fault: str, seconds: float) -> None:
        self.ledger.record("chaos_requested", fault=fault, node=entry.name, seconds=seconds)
        entry.outbox.put({"type": "chaos", "fault": fault, "seconds": seconds})

    def _fire_node_chaos(self) -> None:
        """Scheduled node faults (``--chaos kill-node|partition:node=N:step=S``) go out once
        some rank has committed step S-1, i.e. while the job runs step S."""
        for event in list(self.chaos_pending.values()):
            entry = self.nodes.get(f"node{event.node}")
            due = event.action in NODE_ACTIONS and event.step <= self.highest_committed + 1
            if due and entry is not None and entry.alive:
                del self.chaos_pending[event.id]
                self.ledger.record("chaos_fired", process=f"agent@{entry.name}", **event.to_dict())
                self._send_node_fault(entry, event.action, event.seconds)

    def _node(self, node: str) -> Node:
        with self._cond:
            entry = self.nodes.get(node)
        if entry is None:
            raise ProtocolError(f"node {node!r} never joined")
        return entry

    def _node_lost(self, entry: Node, reason: str) -> None:
        if not entry.alive or self.finished:
            return
        entry.alive = False
        self._spares_launching.pop(entry.name, None)  # its spares on the way are lost too
        lost = [
            m
            for m in self.members.values()
            if m.node == entry.name and m.state not in ("dead", "fenced")
        ]
        self.ledger.record(
            "node_lost", node=entry.name, reason=reason, processes=[m.process for m in lost]
        )
        for member in lost:
            member.detection = "node"
            member.detected_by = f"node {entry.name} lost ({reason})"
            self._on_exit_locked(member.process, -signal.SIGKILL, cause="node lost")
            # Nobody here can kill them: refuse anything they may still send.
            member.state = "fenced"

    def _fence(self, process: str) -> None:
        self._signal(process, signal.SIGKILL)

    def _signal(self, process: str, signum: int) -> None:
        """Have the agent of ``process``'s node send it ``signum``."""
        member = self.members.get(process)
        node = member.node if member is not None else self.local_node
        if node == self.local_node:
            self.agent.kill(process, signum)
        elif self.nodes[node].alive:
            self.nodes[node].outbox.put({"type": "signal", "process": process, "signal": signum})

    def _spare_accounted(self, node: str) -> None:
        """A spare launched on ``node`` joined or exited: it is no longer on its way."""
        self._spares_launching[node] = max(0, self._spares_launching.get(node, 0) - 1)

    def _start_spare(self) -> None:
        """Start a spare on the live node that runs the fewest processes (local on ties)."""
        live = [self.local_node] + [n for n, e in self.nodes.items() if e.alive]

        def load(node: str) -> int:
            return sum(
                1
                for m in self.members.values()
                if m.node == node and m.state not in ("dead", "fenced")
            )

        node = min(live, key=lambda n: (load(n), n != self.local_node))
        self._spares_launching[node] = self._spares_launching.get(node, 0) + 1
        if node == self.local_node:
            self.agent.start_spare()
        else:
            self.nodes[node].outbox.put({"type": "start_spare"})

    # ---------------------------------------------------------------- monitor
    def start_monitor(self, interval: float = 0.25) -> None:
        """Watch heartbeats (hangs) and step timings (stragglers) in a background thread."""
        threading.Thread(
            target=self._monitor, args=(interval,), name="torchrelay-monitor", daemon=True
        ).start()

    def _monitor(self, interval: float) -> None:
        with self._cond:
            while not self.finished:
                self._cond.wait(interval)
                now = time.time()
                self._hang_timeout = self.hang_timeout()
                self._check_nodes(now)
                if not self._finishing:  # past their loops, workers neither step nor beat
                    self._check_liveness(now)
                    self._check_stragglers()

    def hang_timeout(self) -> float:
        """Heartbeat silence that means a hang: a multiple of the job's median step time."""
        steps = [
            m.timings["step_seconds"] for m in self._slot_members() if "step_seconds" in m.timings
        ]
        median = statistics.median(steps) if steps else 0.0
        return max(self.config.hang_floor, self.config.hang_factor * median)

    def _check_nodes(self, now: float) -> None:
        for entry in self.nodes.values():
            silent = now - entry.last_seen
            if entry.alive and silent > self.config.node_timeout:
                self._node_lost(
                    entry,
                    f"no heartbeat for {silent:.1f} s, node timeout "
                    f"{self.config.node_timeout:.1f} s: crashed or cut off",
                )

    def _check_liveness(self, now: float) -> None:
        """Fence hung and stalled workers; re-form the group around a lost collective."""
        watched = [m for m in self._slot_members() if m.state not in ("dead", "fenced", "fencing")]
        # Until a step has been timed, a slow first step (compilation, warm-up) is no stall.
        timed = any("step_seconds" in m.timings for m in watched)
        beats = []
        for m in watched:
            assert m.slot is not None
            step_age, waiting = (m.step_age, m.waiting) if timed else (None, None)
            beats.append(Beat(m.slot, now - m.last_seen, step_age, waiting, m.busy))
        verdict = judge(beats, self._hang_timeout, FRESH_HEARTBEAT)
        for member in watched:
            for detection, reasons in (("heartbeat", verdict.hung), ("stall", verdict.stalled)):
                if member.slot in reasons:
                    member.state, member.detection = "fencing", detection
                    member.detected_by = reasons[member.slot]
                    self.ledger.record(
                        "hang_detected",
                        process=member.process,
                        slot=member.slot,
                        detection=detection,
                        reason=reasons[member.slot],
                        silent_seconds=now - member.last_seen,
                        timeout=self._hang_timeout,
                    )
                    self._fence(member.process)
        quiet = not self._failed and self._recovery is None and self._reform is None
        if verdict.lost_collective is not None and quiet and len(watched) == len(self.assignments):
            self._on_collective_lost(verdict.lost_collective, now, watched)

    def _on_collective_lost(self, reason: str, now: float, members: list[Member]) -> None:
        """Abort the step everywhere and re-form the same members (nobody is replaced)."""
        step = self.highest_committed + 1
        at, count = self._reforms_at
        count = count + 1 if at == step else 1
        self._reforms_at = (step, count)
        failure = {
            "slot": None,
            "process": f"collective@g{self.generation}",
            "last_reported_step": self.highest_committed,
            "cause": "collective never completed",
            "kind": "collective",
            "detected_by": reason,
            "generation": self.generation,
            "t": now,
            "onset": now - max(m.waiting or 0.0 for m in members),
        }
        self.ledger.record("failure", **failure)
        if count > self.config.max_restarts:
            self._fail(
                f"the collectives of step {step} never completed, even after re-forming the "
                f"communicator {count - 1} time(s) (max restarts {self.config.max_restarts}): "
                "a deterministic deadlock (mismatched collectives across ranks?) or a broken "
                "network path"
            )
            return
        self._reform = failure
        self._kick_recovery()

    def _check_stragglers(self) -> None:
        compute = {
            m.slot: m.timings["compute_seconds"]
            for m in self._slot_members()
            if "compute_seconds" in m.timings
        }
        if len(compute) < 2:
            return
        for slot, seconds in compute.items():
            peers = statistics.median(v for s, v in compute.items() if s != slot)
            slow = seconds > self.config.straggler_ratio * peers and seconds - peers > 0.01
            process = self.assignments[slot]  # type: ignore[index]
            if slow and process not in self.stragglers:
                self.stragglers[process] = {
                    "slot": slot,
                    "compute_seconds": seconds,
                    "peers_median": peers,
                    "slowdown": seconds / peers,
                }
                self.ledger.record("straggler", process=process, **self.stragglers[process])

    # ---------------------------------------------------------------- recovery
    def _slot_members(self) -> list[Member]:
        return [self.members[p] for p in self.assignments.values()]

    def _recover_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if not (self._failed or self._replan or self._reform) or self.finished:
                        self._recovery_thread = None
                        return
                self._recover_once()
        except Exception as exc:  # the controller must end the job loudly, never hang it
            with self._cond:
                self._fail(f"recovery crashed in the controller: {exc!r}")
                self._recovery_thread = None

    def _recover_once(self) -> None:
        with self._cond:
            failures = dict(self._failed)
            if self._replan is not None:
                self._replans += 1
                if self._replans > self.config.max_restarts:
                    self._fail(
                        f"recovery failed {self._replans} times in a row; last: {self._replan}"
                    )
                    return
            self._replan = None
            reform, self._reform = self._reform, None
            previous, self._carried = self._carried, None
            merged = (previous.failures if previous else []) + list(failures.values())
            merged += [reform] if reform is not None else []
            recovery = Recovery(merged, min((f["t"] for f in merged), default=time.time()))
            if previous is not None:
                recovery.in_flight = set(previous.in_flight)
            self._recovery = recovery
            old_generation = self.generation
            survivors = [m for m in self._slot_members() if m.slot not in failures]
            for member in survivors:
                member.outbox.put({"type": "abort", "generation": old_generation})
            for failure in failures.values():
                self._fence(failure["process"])
            self.ledger.record(
                "recovery_start",
                generation=old_generation,
                slots=sorted(failures),
                t=recovery.detected,
            )

            def interrupted() -> bool:
                return self.finished or self._failed.keys() != failures.keys()

            self._top_up_spares(len(failures))
            ok = self._cond.wait_for(
                lambda: (
                    interrupted()
                    or len(self._ready_spares()) >= len(failures)
                    or self._no_spare_will_come(len(failures))
                ),
                timeout=self.config.spare_timeout,
            )
            if interrupted():
                self._carried = recovery
                return
            if len(self._ready_spares()) < len(failures) and self._no_spare_will_come(
                len(failures)
            ):
                self._abandon(failures, survivors, interrupted)
                return
            if not ok:
                self._fail(
                    f"no spare became ready within {self.config.spare_timeout:.0f} s to replace "
                    f"slot(s) {sorted(failures)} (started with --spares {self.config.spares}); "
                    "raise --spares or --spare-timeout"
                )
                return
            recovery.spare_ready = time.time()
            halted = self._cond.wait_for(
                lambda: interrupted() or all(m.state == "halted" for m in survivors),
                timeout=self.config.halt_timeout,
            )
            if interrupted():
                self._carried = recovery
                return
            if not halted:
                stuck = sorted(m.slot for m in survivors if m.state != "halted")
                self._fail(
                    f"survivor slot(s) {stuck} did not stop their step within "
                    f"{self.config.halt_timeout:.0f} s after the failure"
                )
                return
            recovery.halted = time.time()
            self._publish_plan(recovery, failures, survivors)

        self._await_recovery_done(recovery)

    def _ready_spares(self) -> list[Member]:
        return [m for m in self.members.values() if m.role == "spare" and m.state == "ready"]

    def _spares_in_sight(self) -> tuple[int, int, int]:
        """Spares (ready, starting, launching) that no slot holds yet."""
        free = [m for m in self.members.values() if m.role == "spare" and m.slot is None]
        return (
            sum(1 for m in free if m.state == "ready"),
            sum(1 for m in free if m.state == "starting"),
            sum(self._spares_launching.values()),
        )

    def _top_up_spares(self, needed: int) -> None:
        """Keep ``--spares`` spares ready or on their way, more while a recovery needs more
        (several slots failed at once); a job started with ``--spares 0`` gets none."""
        if self.config.spares > 0:
            for _ in range(max(needed, self.config.spares) - sum(self._spares_in_sight())):
                self._start_spare()

    def _no_spare_will_come(self, needed: int) -> bool:
        return missing_spares(needed, *self._spares_in_sight())

    def _abandon(
        self,
        failures: dict[int, dict[str, Any]],
        survivors: list[Member],
        interrupted: Callable[[], bool],
    ) -> None:
        """No spare can replace the failed slots: stop now, naming the step in flight. The
        survivors' halted reports (they were aborted, they stop within milliseconds) tell
        the last step committed exactly; heartbeats alone lag behind."""
        self._cond.wait_for(
            lambda: interrupted() or all(m.state == "halted" for m in survivors),
            timeout=self.config.halt_timeout,
        )
        if self.finished:
            return
        step = self.highest_committed + 1
        causes = {slot: str(f["cause"]) for slot, f in failures.items()}
        reason = no_spare_reason(causes, step, self.config.spares)
        self.ledger.record("recovery_abandoned", slots=sorted(failures), step=step, reason=reason)
        self._fail(reason)

    def _publish_plan(
        self, recovery: Recovery, failures: dict[int, dict[str, Any]], survivors: list[Member]
    ) -> None:
        spares = [Spare(m.process, m.node) for m in self._ready_spares()]
        nodes = {m.slot: m.node for m in self._slot_members() if m.slot is not None}
        try:
            replacements = choose_replacements(
                {slot: self.members[f["process"]].node for slot, f in failures.items()},
                spares,
                nodes,  # type: ignore[arg-type]
            )
            plan = plan_recovery(
                self.generation,
                self.assignments,
                replacements,
                {m.slot: m.committed for m in survivors},  # type: ignore[misc]
                self.highest_committed,
                frozenset(m.slot for m in survivors if not m.valid),  # type: ignore[misc]
            )
        except PlanningError as exc:
            self._fail(str(exc))
            return
        recovery.plan, recovery.planned = plan, time.time()
        self.generation = plan.generation
        self.assignments = dict(plan.assignments)
        self._failed.clear()
        message = {
            "type": "plan",
            "generation": plan.generation,
            "target_step": plan.target_step,
            "sources": list(plan.sources),
            "receivers": list(plan.receivers),
            "assignments": {str(k): v for k, v in plan.assignments.items()},
        }
        for slot, process in plan.assignments.items():
            member = self.members[process]
            member.slot, member.generation, member.state = slot, plan.generation, "active"
            if slot in plan.receivers:
                member.claims.clear()  # its state is replaced: back to the target step
            # A fresh start for the detector: the old step's progress means nothing now.
            member.last_seen, member.step_age, member.waiting = time.time(), None, None
            member.outbox.put({**message, "slot": slot, "chaos": self._chaos_for(slot)})
        self.ledger.record(
            "recovery_planned",
            generation=plan.generation,
            target_step=plan.target_step,
            sources=list(plan.sources),
            receivers=list(plan.receivers),
            replaced={str(k): v for k, v in plan.replaced.items()},
            lost_steps=plan.lost_steps,
        )
        self._top_up_spares(0)

    def _phase_done(self, recovery: Recovery, member: Member, phase: str, body: dict) -> None:
        recovery.phases.setdefault(phase, {})[member.slot] = {  # type: ignore[index]
            "t": float(body.get("t", time.time())),
            **{k: body[k] for k in ("bytes", "seconds") if k in body},
        }

    def _await_recovery_done(self, recovery: Recovery) -> None:
        plan = recovery.plan
        if plan is None:
            return
        members = set(plan.assignments)
        with self._cond:
            # Never a silent wait: a plan not carried out in time is abandoned and re-planned.
            limit = recovery_deadline(self.config.halt_timeout, self._hang_timeout)
            settled = self._cond.wait_for(
                lambda: (
                    self.finished
                    or bool(self._failed)
                    or self._replan is not None
                    or members <= set(recovery.phases.get("first_step", {}))
                ),
                timeout=max(0.0, recovery.planned + limit - time.time()),
            )
            if not settled:
                phases = {phase: set(done) for phase, done in recovery.phases.items()}
                self._replan = overdue_reason(plan.generation, limit, plan.assignments, phases)
                self.ledger.record(
                    "recovery_failed", generation=plan.generation, reason=self._replan
                )
            if self.finished:
                return
            if self._failed or self._replan is not None:
                # One recovery covers every failure until the job runs again.
                self.ledger.record("recovery_superseded", generation=plan.generation)
                self._carried = recovery
                return
            self._replans = 0
            self._record_recovery(recovery, plan)
            self._recovery = None
            if all(m.state == "done" for m in self._slot_members()):
                self._finish_training()

    def _record_recovery(self, recovery: Recovery, plan: RecoveryPlan) -> None:
        def latest(phase: str) -> float:
            return max(v["t"] for v in recovery.phases.get(phase, {0: {"t": 0.0}}).values())

        transfers = recovery.phases.get("transfer_done", {})
        received = sum(int(v.get("bytes", 0)) for s, v in transfers.items() if s in plan.receivers)
        timeline = {
            "detected": recovery.detected,
            "spare_ready": recovery.spare_ready,
            "halted": recovery.halted,
            "planned": recovery.planned,
            "comm_ready": latest("comm_ready"),
            "transfer_done": latest("transfer_done"),
            "first_step": latest("first_step"),
        }
        self.ledger.record(
            "recovery_done",
            generation=plan.generation,
            slots=sorted(plan.replaced),
            failures=recovery.failures,
            target_step=plan.target_step,
            timeline=timeline,
            recovery_seconds=timeline["first_step"] - timeline["detected"],
            stall_seconds=timeline["first_step"] - min(f["onset"] for f in recovery.failures),
            # The stall as each survivor saw it, detection included (the above starts later).
            survivor_gap_seconds=survivor_gaps(
                {
                    slot: self.members[process].last_commit_t
                    for slot, process in plan.assignments.items()
                    if slot not in plan.replaced
                },
                {slot: v["t"] for slot, v in recovery.phases.get("first_step", {}).items()},
            ),
            bytes_transferred=received,
            lost_steps=plan.lost_steps,
            recomputed_steps=len({s for s in recovery.in_flight if s > plan.target_step}),
            sources=list(plan.sources),
            receivers=list(plan.receivers),
        )

    # ---------------------------------------------------------------- endings
    def _finish_training(self) -> None:
        """Every slot committed its last step: let every process out of its loop. The job
        succeeds once the slots' processes have all exited with 0 (their final work, such as
        saving the model, is waited for; see :meth:`_on_exit_after_training`)."""
        self._finishing = True
        self.ledger.record("training_done", steps_committed=self.highest_committed + 1)
        for member in self.members.values():
            member.outbox.put({"type": "finish"})
        self._cond.notify_all()

    def _succeed(self) -> None:
        self._end("succeeded")
        for node in self.nodes.values():
            node.outbox.put({"type": "finish"})

    def _fail(self, reason: str, traceback: str | None = None) -> None:
        if self.outcome is not None:
            return
        self._end("failed", reason=reason, **({"traceback": traceback} if traceback else {}))

    def _end(self, status: str, **details: Any) -> None:
        """Set the job's one outcome and record it (``job_end``, with the refused-request
        counts); called with the lock held."""
        self.outcome = {"status": status, **details, "steps_committed": self.highest_committed + 1}
        self.ledger.record("job_end", **self.outcome, rejected_requests=self.rejections.counts())
        self._cond.notify_all()


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _failure_kind(member: Member, returncode: int) -> str:
    """``stall`` and script failures count against ``--max-restarts``; the others do not."""
    if member.detection == "stall":
        return "stall"
    if returncode in SELF_FENCED:
        return "fenced"
    if returncode < 0:
        return "signal"
    return "exception" if member.error else "exit"


def _onset(member: Member) -> float:
    """When the failed member really stopped being useful (for the stall accounting)."""
    if member.detection in ("heartbeat", "node"):
        return member.last_seen  # its last sign of life
    if member.detection == "stall" and member.step_age is not None:
        return member.last_seen - member.step_age
    return time.time()
