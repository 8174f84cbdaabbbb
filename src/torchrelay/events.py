"""The ledger's events, typed: what the controller records and the report and simulator read.

Each event is a frozen dataclass named by ``NAME`` (its ``"event"``); ``to_json()`` is the
ledger line's object, ``{"t": ..., "event": ..., <fields>}`` as ever (``t`` is the time of
writing unless the event carries its own), so old ledgers still read. ``from_json(obj)`` checks
the fields and raises :class:`~torchrelay.ledger.LedgerError` with one line on a malformed one.
:func:`read_events` reads a ledger file into events, skipping events it does not know (written
by a newer version) and -- when not ``strict`` -- malformed ones too.

Imports neither torch nor the controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torchrelay.event_base import Event
from torchrelay.events_chaos import ChaosFired, ChaosInjected, ChaosRequested
from torchrelay.events_criu import CopyFailed, ReplicaCloned, WorkerMigrated
from torchrelay.events_durable import CheckpointSaved, FallbackRestart, Progress, Resumed
from torchrelay.events_elastic import JobGrown, JobShrunk
from torchrelay.events_moves import (
    ControllerTakeover,
    HandoverAbandoned,
    HandoverDone,
    HandoverLate,
    HandoverRequested,
    HandoverStart,
)
from torchrelay.events_pool import (
    JobParked,
    JobUnparked,
    PoolAsked,
    PoolAttached,
    PoolGranted,
    PoolLend,
    PoolRefused,
    PoolReturned,
)
from torchrelay.ledger import LedgerError, read_ledger
from torchrelay.typed import OMIT, optional, registry


@dataclass(frozen=True, kw_only=True)
class JobStart(Event):
    TAG: ClassVar[str] = "job_start"
    world_size: int
    spares: int = 0
    script: str = ""
    args: tuple[str, ...] = ()
    chaos: tuple[dict[str, Any], ...] = ()
    run_dir: str = ""


@dataclass(frozen=True, kw_only=True)
class JobEnd(Event):
    TAG: ClassVar[str] = "job_end"
    status: str
    reason: str | None = optional()
    signal: str | None = optional()
    traceback: str | None = optional()
    steps_committed: int
    rejected_requests: dict[str, int] | None = field(default=None, metadata=OMIT)


@dataclass(frozen=True, kw_only=True)
class ProcessJoin(Event):
    TAG: ClassVar[str] = "process_join"
    process: str
    role: str
    slot: int | None
    pid: int
    node: str


@dataclass(frozen=True, kw_only=True)
class ProcessExit(Event):
    """An exit its agent saw: of a member (``slot``, ``cause``, ``state``) or of a process that
    never joined (``note``)."""

    TAG: ClassVar[str] = "process_exit"
    process: str
    slot: int | None = optional()
    returncode: int
    cause: str | None = optional()
    state: str | None = optional()
    note: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class Failure(Event):
    """A slot's failure (``slot`` None: the whole job's collective); ``onset``: when it really
    stopped being useful; ``step``: the step in flight, when known. (Ledgers of older versions
    may lack ``generation`` and ``onset``.)"""

    TAG: ClassVar[str] = "failure"
    slot: int | None
    process: str
    last_reported_step: int
    cause: str
    kind: str
    detected_by: str
    generation: int | None = optional()
    onset: float | None = optional()
    traceback: str | None = optional()
    step: int | None = optional()


@dataclass(frozen=True, kw_only=True)
class HangDetected(Event):
    TAG: ClassVar[str] = "hang_detected"
    process: str
    slot: int | None
    detection: str
    reason: str
    silent_seconds: float
    timeout: float


@dataclass(frozen=True, kw_only=True)
class Straggler(Event):
    TAG: ClassVar[str] = "straggler"
    process: str
    slot: int | None
    compute_seconds: float
    peers_median: float
    slowdown: float


@dataclass(frozen=True, kw_only=True)
class RecoveryStart(Event):
    TAG: ClassVar[str] = "recovery_start"
    generation: int
    slots: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RecoveryPlanned(Event):
    TAG: ClassVar[str] = "recovery_planned"
    generation: int
    target_step: int
    sources: tuple[int, ...]
    receivers: tuple[int, ...]
    replaced: dict[str, str]
    lost_steps: int


@dataclass(frozen=True, kw_only=True)
class RecoveryFailed(Event):
    """A plan was not carried out: a member said why (``process``, ``slot``) or it was late."""

    TAG: ClassVar[str] = "recovery_failed"
    process: str | None = optional()
    slot: int | None = optional()
    generation: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class RecoverySuperseded(Event):
    TAG: ClassVar[str] = "recovery_superseded"
    generation: int


@dataclass(frozen=True, kw_only=True)
class RecoveryAbandoned(Event):
    TAG: ClassVar[str] = "recovery_abandoned"
    slots: tuple[int, ...]
    step: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class RecoveryDone(Event):
    """A finished recovery: its failures, ``timeline`` (phase -> time), the stalls, the cost.
    (Ledgers of older versions may lack ``generation``, ``sources`` and ``receivers``.)"""

    TAG: ClassVar[str] = "recovery_done"
    generation: int | None = optional()
    slots: tuple[int, ...]
    failures: tuple[dict[str, Any], ...]
    target_step: int
    timeline: dict[str, float]
    recovery_seconds: float
    stall_seconds: float
    survivor_gap_seconds: dict[str, float] | None = field(default=None, metadata=OMIT)
    bytes_transferred: int
    lost_steps: int
    recomputed_steps: int
    sources: tuple[int, ...] = ()
    receivers: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TrainingDone(Event):
    TAG: ClassVar[str] = "training_done"
    steps_committed: int


@dataclass(frozen=True, kw_only=True)
class SpareReady(Event):
    """A spare can take a slot: ``cpu_seconds`` it used to get there (its own, since fork or
    exec), ``forked`` whether it came from its node's template."""

    TAG: ClassVar[str] = "spare_ready"
    process: str
    cpu_seconds: float | None = optional()
    forked: bool | None = optional()


@dataclass(frozen=True, kw_only=True)
class SpareLost(Event):
    TAG: ClassVar[str] = "spare_lost"
    process: str
    cause: str
    traceback: str | None


@dataclass(frozen=True, kw_only=True)
class NodeJoined(Event):
    TAG: ClassVar[str] = "node_join"
    node: str


@dataclass(frozen=True, kw_only=True)
class NodeLost(Event):
    TAG: ClassVar[str] = "node_lost"
    node: str
    reason: str
    processes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class FencedRefused(Event):
    """A report of a fenced process (``process``...) or of a lost node (``node``, ``kind``)."""

    TAG: ClassVar[str] = "fenced_refused"
    process: str | None = optional()
    slot: int | None = optional()
    generation: int | None = optional()
    current_generation: int | None = optional()
    node: str | None = optional()
    kind: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class ClaimRefused(Event):
    TAG: ClassVar[str] = "claim_refused"
    process: str
    kind: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class WarningEvent(Event):
    """A worker's finding about the user's state (see runtime/replicas.py)."""

    TAG: ClassVar[str] = "warning"
    process: str
    slot: int | None
    step: int | None
    what: str
    objects: tuple[str, ...]
    message: str


@dataclass(frozen=True, kw_only=True)
class Rejected(Event):
    """A sample of the requests the control server refused (see control/rejections.py)."""

    TAG: ClassVar[str] = "rejected_message"
    reason: str
    count: int
    detail: str
    peer: str


@dataclass(frozen=True, kw_only=True)
class RejectedSummary(Rejected):
    TAG: ClassVar[str] = "rejected_summary"


@dataclass(frozen=True, kw_only=True)
class Bench(Event):
    """A benchmark's measured step-time ``overhead`` (a fraction) of torchrelay."""

    TAG: ClassVar[str] = "bench"
    overhead: float


EVENTS = registry(
    JobStart,
    JobEnd,
    ProcessJoin,
    ProcessExit,
    Failure,
    HangDetected,
    Straggler,
    RecoveryStart,
    RecoveryPlanned,
    RecoveryFailed,
    RecoverySuperseded,
    RecoveryAbandoned,
    RecoveryDone,
    TrainingDone,
    SpareReady,
    SpareLost,
    NodeJoined,
    NodeLost,
    HandoverRequested,
    HandoverStart,
    HandoverLate,
    HandoverDone,
    HandoverAbandoned,
    ControllerTakeover,
    JobShrunk,
    JobGrown,
    PoolAttached,
    PoolAsked,
    PoolGranted,
    PoolRefused,
    PoolLend,
    PoolReturned,
    JobParked,
    JobUnparked,
    ReplicaCloned,
    WorkerMigrated,
    CopyFailed,
    FencedRefused,
    ClaimRefused,
    WarningEvent,
    ChaosRequested,
    ChaosInjected,
    ChaosFired,
    Rejected,
    RejectedSummary,
    Bench,
    Progress,
    CheckpointSaved,
    Resumed,
    FallbackRestart,
)


def parse_event(entry: dict[str, Any]) -> Event | None:
    """The typed event of a ledger line's object; None for an event this version does not know."""
    name = entry.get("event")
    cls = EVENTS.get(name) if isinstance(name, str) else None
    return None if cls is None else cls.from_json(entry)


def read_events(path: Path, strict: bool = True) -> list[Event]:
    """Every event of a ledger file this version knows, in order (see :func:`read_ledger` for
    torn lines). A malformed event raises :class:`LedgerError`, or is skipped if not ``strict``."""
    events = []
    for entry in read_ledger(path):
        try:
            event = parse_event(entry)
        except LedgerError as exc:
            if strict:
                raise LedgerError(f"{path} has a malformed event: {exc}") from None
            continue
        if event is not None:
            events.append(event)
    return events
