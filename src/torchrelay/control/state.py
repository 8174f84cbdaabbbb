"""The job's state as plain data: enums with documented transitions and dataclasses.

Everything the controller knows about a job and needs to carry on after a restart lives in one
:class:`JobState`: its members, node agents, generation, assignments, committed steps, pending
failures and the recovery in progress. It round-trips through JSON (:meth:`JobState.to_dict`,
:meth:`JobState.from_dict`) so that it can be stored outside the controller's memory. What
cannot be stored -- outboxes, threads, the lock, the ledger, the agent -- lives in the
controller and its executor, never here.

The transition modules (membership, departures, liveness, recovery_steps, drills, nodes) change
a :class:`JobState` in place and return the actions that carry the change out.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from torchrelay.chaos import ChaosEvent
from torchrelay.control.errors import IllegalTransition, ProtocolError
from torchrelay.control.planner import RecoveryPlan


class Role(enum.Enum):
    """Why a process was started: to fill a slot from the start, or to wait for one."""

    WORKER = "worker"
    SPARE = "spare"


class MemberState(enum.Enum):
    """Where a member stands; :data:`TRANSITIONS` lists the moves :func:`move` allows.

    A worker joins ``ACTIVE``; a spare joins ``STARTING`` and reports ``READY`` at its first
    step boundary. A plan makes every member of the new generation ``ACTIVE``. An aborted or
    failed member reports ``HALTED``; one past its last step ``DONE``. The monitor marks a hung
    or stalled member ``FENCING`` when it has it killed (its ``done`` is not taken: the kill
    is on the way, and its slot is recovered from its exit). An exit makes any member ``DEAD``;
    one whose node was declared lost is ``FENCED`` (after its loss was handled as an exit):
    nothing it sends is accepted again. A member whose slot was handed to another process at a
    step boundary (drain, health migration) is ``RETIRED``: told to leave, its reports are
    ignored and its exit is no failure.
    """

    STARTING = "starting"
    READY = "ready"
    ACTIVE = "active"
    HALTED = "halted"
    DONE = "done"
    FENCING = "fencing"
    FENCED = "fenced"
    RETIRED = "retired"
    DEAD = "dead"


_S = MemberState
# Every state may also be re-entered (a second ``halted`` report, a second exit).
TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    _S.STARTING: frozenset({_S.READY, _S.ACTIVE, _S.DEAD}),
    _S.READY: frozenset({_S.ACTIVE, _S.DEAD}),
    _S.ACTIVE: frozenset({_S.HALTED, _S.DONE, _S.FENCING, _S.DEAD}),
    _S.HALTED: frozenset({_S.ACTIVE, _S.DONE, _S.FENCING, _S.RETIRED, _S.DEAD}),
    # A member past its last step is aborted (and halts) when another slot fails.
    _S.DONE: frozenset({_S.HALTED, _S.ACTIVE, _S.FENCING, _S.DEAD}),
    # Reports sent before the kill landed still arrive.
    _S.FENCING: frozenset({_S.HALTED, _S.DEAD}),
    _S.RETIRED: frozenset({_S.DEAD}),
    _S.DEAD: frozenset({_S.FENCED}),
    _S.FENCED: frozenset(),
}
GONE = frozenset({_S.DEAD, _S.FENCED})  # nothing from these is accepted any more


class Detection(enum.Enum):
    """How a member's failure was noticed (the ``detection`` of ``hang_detected``)."""

    EXIT = "exit"  # its agent's waitpid
    HEARTBEAT = "heartbeat"  # its heartbeats stopped
    STALL = "stall"  # it heartbeats but its step makes no progress outside any collective
    NODE = "node"  # its node agent was lost


class JobPhase(enum.Enum):
    """RUNNING -> FINISHING (every slot is done) -> SUCCEEDED; any -> FAILED or TERMINATED.

    The last three are the job's outcome (``job_end``'s ``status``) and final.
    """

    RUNNING = "running"
    FINISHING = "finishing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TERMINATED = "terminated"


ENDED = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.TERMINATED})


class RecoveryStep(enum.Enum):
    """What a recovery waits for: SPARES (enough ready) -> HALT (every survivor halted) ->
    DONE (every member committed its first step of the new generation). ABANDON: no spare can
    come, waiting for the survivors' halts to name the step in flight. SUPERSEDED: a new
    failure or a failed plan; the next recovery takes its failures over."""

    SPARES = "spares"
    HALT = "halt"
    ABANDON = "abandon"
    DONE = "done"
    SUPERSEDED = "superseded"


def move(member: Member, new: MemberState) -> None:
    """Move ``member`` to ``new``; raises :class:`IllegalTransition` for a move no protocol
    path makes (the member is left as it was)."""
    if new is not member.state and new not in TRANSITIONS[member.state]:
        raise IllegalTransition(
            f"{member.process} cannot go from {member.state.value} to {new.value}"
        )
    member.state = new


@dataclass
class Member:
    """One process known to the controller."""

    process: str
    role: Role
    node: str
    pid: int
    last_seen: float
    slot: int | None = None
    generation: int = -1
    state: MemberState = MemberState.STARTING
    committed: int = -1
    valid: bool = True
    timings: dict[str, float] = field(default_factory=dict)
    step_age: float | None = None
    waiting: float | None = None
    busy: bool = False
    detection: Detection = Detection.EXIT
    detected_by: str = "process exit (waitpid)"
    error: dict[str, Any] | None = None
    # Highest step claimed per report channel (see control.claims); cleared on a receiver.
    claims: dict[str, int] = field(default_factory=dict)
    returncode: int | None = None
    last_commit_t: float | None = None  # wall time of its last commit, from its halted report
    device: int | None = None  # the device index its agent gave it (LOCAL_RANK)

    def to_dict(self) -> dict[str, Any]:
        """Its fields as plain data, shallow (its dicts are the member's own): the durable
        state serializes it at once, and deep copies of every member were most of the cost
        of writing a large job's state (docs/benchmarks.md)."""
        data = {name: getattr(self, name) for name in _MEMBER_FIELDS}
        data.update(role=self.role.value, state=self.state.value, detection=self.detection.value)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Member:
        member = cls(**data)
        member.role, member.state = Role(data["role"]), MemberState(data["state"])
        member.detection = Detection(data["detection"])
        return member


_MEMBER_FIELDS = tuple(f.name for f in fields(Member))


@dataclass
class NodeEntry:
    """A remote node agent, reached through the commands it watches; it heartbeats."""

    name: str
    last_seen: float
    alive: bool = True
    chaos_notice: dict[str, Any] | None = None  # what it said of the last drill sent to it


@dataclass
class Round:
    """One recovery, from ``recovery_start`` to ``recovery_done``, filled as it goes.

    ``slots`` are the failed slots it replaces (the pending failures when it started),
    ``survivors`` the processes of the other slots. A superseded round's ``failures`` and
    ``in_flight`` are carried into the next.
    """

    failures: list[dict[str, Any]]
    detected: float
    slots: list[int]
    survivors: list[str]
    step: RecoveryStep = RecoveryStep.SPARES
    step_since: float = 0.0  # when the current step began
    step_limit: float = 0.0  # seconds it may take before the recovery gives up on it
    plan: RecoveryPlan | None = None
    spare_ready: float = 0.0
    halted: float = 0.0
    planned: float = 0.0
    phases: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    in_flight: set[int] = field(default_factory=set)
    # A planned handover instead of a recovery: {"boundary": step, "aborted": bool,
    # "requests": {slot (str): request}, "told_late": {process: step}} (see control.handover).
    handover: dict[str, Any] | None = None
    # No spare can come and the job is --elastic: survivors host the failed slots
    # (see control.elastic) instead of the job stopping.
    shrink: bool = False
    # Transparent mode: the copies made for this round (replica_cloned events, as dicts).
    copies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def deadline(self) -> float:
        return self.step_since + self.step_limit

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            step=self.step.value,
            plan=None if self.plan is None else _plan_to_dict(self.plan),
            phases={p: _str_keys(done) for p, done in self.phases.items()},
            in_flight=sorted(self.in_flight),
        )
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Round:
        plan = data["plan"]
        return cls(
            **{
                **data,
                "step": RecoveryStep(data["step"]),
                "plan": None if plan is None else _plan_from_dict(plan),
                "phases": {p: _int_keys(done) for p, done in data["phases"].items()},
                "in_flight": set(data["in_flight"]),
            }
        )


@dataclass
class RecoveryState:
    """Failures waiting for a recovery, the recovery in progress and the counters that bound
    retries (``--max-restarts``)."""

    failed: dict[int, dict[str, Any]] = field(default_factory=dict)  # slot -> failure record
    reform: dict[str, Any] | None = None  # a lost collective: re-form the same members
    reforms_at: tuple[int, int] = (-1, 0)  # (step, re-forms of that step so far)
    replan: str | None = None  # why the published plan must be made again
    replans: int = 0  # plans made again in a row
    current: Round | None = None
    # Slots to hand over at a step boundary (drain, health): slot -> its request.
    handovers: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        """A recovery has to start (or start over)."""
        return bool(self.failed) or self.replan is not None or self.reform is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "failed": _str_keys(self.failed),
            "reform": self.reform,
            "reforms_at": list(self.reforms_at),
            "replan": self.replan,
            "replans": self.replans,
            "current": None if self.current is None else self.current.to_dict(),
            "handovers": _str_keys(self.handovers),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecoveryState:
        current = data["current"]
        return cls(
            failed=_int_keys(data["failed"]),
            reform=data["reform"],
            reforms_at=tuple(data["reforms_at"]),  # type: ignore[arg-type]
            replan=data["replan"],
            replans=data["replans"],
            current=None if current is None else Round.from_dict(current),
            handovers=_int_keys(data.get("handovers", {})),
        )


@dataclass
class JobState:
    """Everything the controller decides from (see the module docstring)."""

    # The node whose agent the controller calls directly: its own launcher's. None once a
    # standby leads (every node agent is then remote, the standby's own included).
    local_node: str | None
    hang_timeout: float
    # The node whose launcher runs the controller; it is lost with the controller.
    leader_node: str = "node0"
    # host:port of the rendezvous store that the next generations meet in (a new leader
    # serves a new one: the old one died with its host).
    store: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    nodes: dict[str, NodeEntry] = field(default_factory=dict)
    generation: int = 0
    assignments: dict[int, str] = field(default_factory=dict)  # slot -> process
    # An --elastic job's slots with no process of their own: virtual slot -> the slot whose
    # process runs its micro-batches too (see control.elastic).
    hosted: dict[int, int] = field(default_factory=dict)
    highest_committed: int = -1
    max_steps: int | None = None  # declared by the workers (Relay.steps)
    chaos_pending: dict[int, ChaosEvent] = field(default_factory=dict)
    bug_restarts: int = 0
    spare_failures: int = 0
    stragglers: dict[str, dict[str, Any]] = field(default_factory=dict)
    straggler_rounds: dict[str, int] = field(default_factory=dict)  # in a row, per process
    # Spare processes started on each node that have neither joined nor exited yet.
    spares_launching: dict[str, int] = field(default_factory=dict)
    # --pool: replacement slots asked of the pool and neither granted nor refused yet.
    pool_asked: int = 0
    recovery: RecoveryState = field(default_factory=RecoveryState)
    phase: JobPhase = JobPhase.RUNNING
    outcome: dict[str, Any] | None = None  # set with the phase that ends the job

    @property
    def finished(self) -> bool:
        return self.phase in ENDED

    def member(self, process: str) -> Member:
        """The member ``process``; :class:`ProtocolError` if it never joined."""
        member = self.members.get(process)
        if member is None:
            raise ProtocolError(f"unknown process {process!r}: it never joined this job")
        return member

    def slot_members(self) -> list[Member]:
        return [self.members[p] for p in self.assignments.values()]

    def by_slot(self) -> dict[int, Member]:
        """The member that fills each slot."""
        return {slot: self.members[p] for slot, p in self.assignments.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_node": self.local_node,
            "hang_timeout": self.hang_timeout,
            "leader_node": self.leader_node,
            "store": self.store,
            "members": {p: m.to_dict() for p, m in self.members.items()},
            "nodes": {n: asdict(e) for n, e in self.nodes.items()},
            "generation": self.generation,
            "assignments": _str_keys(self.assignments),
            "hosted": _str_keys(self.hosted),
            "highest_committed": self.highest_committed,
            "max_steps": self.max_steps,
            "chaos_pending": [e.to_dict() for e in self.chaos_pending.values()],
            "bug_restarts": self.bug_restarts,
            "spare_failures": self.spare_failures,
            "stragglers": self.stragglers,
            "straggler_rounds": self.straggler_rounds,
            "spares_launching": self.spares_launching,
            "pool_asked": self.pool_asked,
            "recovery": self.recovery.to_dict(),
            "phase": self.phase.value,
            "outcome": self.outcome,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobState:
        chaos = [ChaosEvent.from_dict(e) for e in data["chaos_pending"]]
        return cls(
            **{
                **data,
                "members": {p: Member.from_dict(m) for p, m in data["members"].items()},
                "nodes": {n: NodeEntry(**e) for n, e in data["nodes"].items()},
                "assignments": _int_keys(data["assignments"]),
                "hosted": _int_keys(data.get("hosted", {})),
                "chaos_pending": {e.id: e for e in chaos},
                "recovery": RecoveryState.from_dict(data["recovery"]),
                "phase": JobPhase(data["phase"]),
            }
        )


def _str_keys(mapping: dict[int, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in mapping.items()}


def _int_keys(mapping: dict[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in mapping.items()}


def _plan_to_dict(plan: RecoveryPlan) -> dict[str, Any]:
    data = asdict(plan)
    data.update(assignments=_str_keys(plan.assignments), replaced=_str_keys(plan.replaced))
    return data


def _plan_from_dict(data: dict[str, Any]) -> RecoveryPlan:
    return RecoveryPlan(
        generation=data["generation"],
        target_step=data["target_step"],
        assignments=_int_keys(data["assignments"]),
        sources=tuple(data["sources"]),
        receivers=tuple(data["receivers"]),
        replaced=_int_keys(data["replaced"]),
        lost_steps=data["lost_steps"],
    )
