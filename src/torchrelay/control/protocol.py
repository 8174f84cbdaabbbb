"""Every control message, typed: what workers, node agents and the controller say to each other.

Four directions, each a family of frozen dataclasses named on the wire by one key:

* worker -> controller (``Report``, key ``kind``): ``max_steps``, ``progress``, ``ready``,
  ``halted``, ``phase``, ``done``, ``error``, ``chaos_fired``, ``warning``; plus the
  ``Join`` request and its :class:`JoinAnswer`, and the heartbeat's :class:`Lease`;
* controller -> worker, on its watch stream (``Message``, key ``type``): ``abort``, ``plan``,
  ``finish``;
* node agent -> controller (``NodeReport``, key ``kind``) and controller -> node agent
  (``Command``, key ``type``): defined in :mod:`torchrelay.control.node_protocol`, re-exported
  here.

``to_wire()`` is the JSON object that is sealed (:mod:`torchrelay.control.wire`); the client adds
the sender's ``process`` to a request. ``from_wire(obj)`` checks every field's type and range
and raises :class:`ProtocolError` with one line (the controller answers ``INVALID_ARGUMENT``);
:func:`decode_report`, :func:`decode_node_report`, :func:`decode_message` and
:func:`decode_command` dispatch on the key. Steps are ``>= -1`` (``-1``: none committed yet),
generations, slots, pids and byte counts ``>= 0``. A step claim that is well-formed but does
not fit the job (beyond ``max_steps``, going backwards) is the controller's to judge
(:mod:`torchrelay.control.claims`), not the decoder's.

Imports neither torch nor the controller: workers and operators' tools load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torchrelay.control.errors import ProtocolError  # noqa: F401 (re-exported)

# The node agents' families: every control message can be imported from here.
from torchrelay.control.node_protocol import (  # noqa: F401 (re-exported)
    COMMANDS,
    COPY_KINDS,
    NODE_REPORTS,
    Chaos,
    ChaosNotice,
    Command,
    CopyOutcome,
    CopyProcess,
    FinishNode,
    HealthReport,
    NodeExit,
    NodeHeartbeat,
    NodeJoin,
    NodeJoinAnswer,
    NodeReport,
    Seated,
    Signal,
    StartSpare,
    decode_command,
    decode_node_report,
)
from torchrelay.control.protocol_base import (
    GENERATION,
    MEMBER_GENERATION,
    Wire,
    decode_family,
    member_generation,
)
from torchrelay.control.slot_runs import check as check_runs
from torchrelay.typed import at_least, optional, registry, step

ROLES = ("worker", "spare")


# --------------------------------------------------------------------- worker -> controller
@dataclass(frozen=True, kw_only=True)
class JoinRequest(Wire):
    """A worker (naming its ``slot``) or a spare (``slot`` None) joins the job; ``device``:
    the device index its agent gave it (``LOCAL_RANK``)."""

    role: str
    pid: int = at_least(0, "a process id (an integer >= 0)")
    node: str
    slot: int | None = at_least(0, "a slot (an integer >= 0)", default=None)
    device: int | None = at_least(0, "a device index (an integer >= 0)", default=None, omit=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.role not in ROLES:
            self._refuse(f"unknown role {self.role!r} (expected one of {', '.join(ROLES)})")


@dataclass(frozen=True, kw_only=True)
class JoinAnswer(Wire):
    """What a process learns on joining: the job's size, its generation, its chaos events,
    and its timeouts (see :class:`torchrelay.config.JobConfig`)."""

    world_size: int = at_least(1, "a world size (an integer >= 1)")
    generation: int = at_least(-1, MEMBER_GENERATION)
    chaos: tuple[dict[str, Any], ...] = ()
    collective_timeout: float = at_least(0.0, "a timeout in seconds (>= 0)")
    rendezvous_timeout: float = at_least(0.0, "a timeout in seconds (>= 0)")


@dataclass(frozen=True, kw_only=True)
class Report(Wire):
    """A worker's report; ``generation`` is the one it reports from (None: not said)."""

    KEY: ClassVar[str] = "kind"
    generation: int | None = member_generation()


@dataclass(frozen=True, kw_only=True)
class MaxSteps(Report):
    TAG: ClassVar[str] = "max_steps"
    max_steps: int = at_least(0, "a number of steps (an integer >= 0)")


@dataclass(frozen=True, kw_only=True)
class Progress(Report):
    """A heartbeat (with the worker's timings and what it waits on), or -- with
    ``first_after_recovery`` -- the first step it committed after a recovery, at time ``t``."""

    TAG: ClassVar[str] = "progress"
    step: int = step()
    step_age: float | None = optional()
    waiting: float | None = optional()
    busy: str | None = optional()
    step_seconds: float | None = optional()
    compute_seconds: float | None = optional()
    first_after_recovery: bool | None = optional()
    t: float | None = optional()


@dataclass(frozen=True, kw_only=True)
class Ready(Report):
    """A spare reached its first step boundary: it can take a slot. ``cpu_seconds``: the CPU
    time it used to get there; ``forked``: whether its node's template forked it."""

    TAG: ClassVar[str] = "ready"
    cpu_seconds: float | None = optional()
    forked: bool | None = optional()


@dataclass(frozen=True, kw_only=True)
class Halted(Report):
    """The worker stopped at ``committed`` (``in_flight``: the step it dropped); ``valid``
    False when its state may be half-overwritten; ``reason`` when a plan could not be entered."""

    TAG: ClassVar[str] = "halted"
    committed: int = step()
    in_flight: int | None = at_least(0, "a step (an integer >= 0)", default=None)
    last_commit_t: float | None = optional()
    valid: bool | None = optional()
    reason: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class PhaseDone(Report):
    """A phase of a recovery (``comm_ready``, ``transfer_done``) done at ``t``, its own clock."""

    TAG: ClassVar[str] = "phase"
    phase: str
    t: float | None = optional()
    bytes: int | None = at_least(0, "a byte count (an integer >= 0)", default=None, omit=True)
    seconds: float | None = at_least(0.0, "a duration (>= 0)", default=None, omit=True)


@dataclass(frozen=True, kw_only=True)
class ToldLate(Report):
    """The worker heard of a handover's boundary only after committing ``step`` (>= the
    boundary) and looking past it: it is inside the next step (see
    :mod:`torchrelay.runtime.handover_boundary`)."""

    TAG: ClassVar[str] = "told_late"
    step: int = step()


@dataclass(frozen=True, kw_only=True)
class Done(Report):
    TAG: ClassVar[str] = "done"
    step: int = step()


@dataclass(frozen=True, kw_only=True)
class ErrorReport(Report):
    """The script raised (``step``: the step it was in, None outside the loop)."""

    TAG: ClassVar[str] = "error"
    step: int | None = at_least(-1, "a step (an integer >= -1)", default=None)
    traceback: str


@dataclass(frozen=True, kw_only=True)
class ChaosFired(Report):
    TAG: ClassVar[str] = "chaos_fired"
    id: int = at_least(0, "a chaos event id (an integer >= 0)")


@dataclass(frozen=True, kw_only=True)
class WarningReport(Report):
    """A finding about the user's state (``what``: its kind; ``objects``: the names)."""

    TAG: ClassVar[str] = "warning"
    step: int | None = None
    message: str
    what: str = ""
    objects: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Lease(Wire):
    """The answer to a heartbeat: the hang timeout, of which the worker's lease is a multiple."""

    hang_timeout: float = at_least(0.0, "a timeout in seconds (>= 0)")


# --------------------------------------------------------------------- controller -> worker
@dataclass(frozen=True, kw_only=True)
class Message(Wire):
    KEY: ClassVar[str] = "type"


@dataclass(frozen=True, kw_only=True)
class Abort(Message):
    """Generation ``generation`` is over: drop the step in flight and report halted."""

    TAG: ClassVar[str] = "abort"
    generation: int = at_least(0, GENERATION)


@dataclass(frozen=True, kw_only=True)
class Plan(Message):
    """Enter ``generation`` as ``slot``, one of ``members``: ``sources`` send the state at
    ``target_step`` to the receivers; ``chaos``: the slot's pending chaos events; ``store``:
    the rendezvous store (``host:port``) to meet in, when it is not the one the process
    started with (a new leader serves its own). ``members`` and ``sources`` are runs of slots
    (:mod:`torchrelay.control.slot_runs`): every member gets a plan."""

    TAG: ClassVar[str] = "plan"
    generation: int = at_least(0, GENERATION)
    target_step: int = step()
    sources: tuple[tuple[int, ...], ...]
    receivers: tuple[int, ...]
    members: tuple[tuple[int, ...], ...]
    slot: int = at_least(0, "a slot (an integer >= 0)")
    chaos: tuple[dict[str, Any], ...] = ()
    store: str | None = optional()
    # An --elastic job's hosted slots: virtual slot -> the slot whose process runs its
    # micro-batches too (the process group has one member per assigned slot only).
    hosted: dict[str, int] | None = optional()  # noqa: RUF009 (the default is None)

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in ("members", "sources"):
            try:
                check_runs(getattr(self, field))
            except ValueError as exc:
                self._refuse(f"{field}: {exc}")


@dataclass(frozen=True, kw_only=True)
class Handover(Message):
    """A planned handover: halt right after committing ``step`` of ``generation`` (every rank
    at the same boundary, so no step is dropped) and wait for the plan."""

    TAG: ClassVar[str] = "handover"
    generation: int = at_least(0, GENERATION)
    step: int = step()


@dataclass(frozen=True, kw_only=True)
class Retire(Message):
    """This process's slot was handed to another process: leave the job, exit 0."""

    TAG: ClassVar[str] = "retire"


@dataclass(frozen=True, kw_only=True)
class Park(Message):
    """Transparent mode: at this step boundary (halted in ``generation``), drop every socket
    and wait on the park channel to be copied by the node agent (see
    :mod:`torchrelay.runtime.parking`); then reconnect and go on waiting for the plan."""

    TAG: ClassVar[str] = "park"
    generation: int = at_least(0, GENERATION)


@dataclass(frozen=True, kw_only=True)
class Finish(Message):
    """The job is over (on a worker's stream and on a node agent's)."""

    TAG: ClassVar[str] = "finish"


REPORTS = registry(
    MaxSteps,
    Progress,
    Ready,
    Halted,
    PhaseDone,
    ToldLate,
    Done,
    ErrorReport,
    ChaosFired,
    WarningReport,
)
MESSAGES = registry(Abort, Plan, Handover, Retire, Park, Finish)


def decode_report(wire: Any) -> Report:
    """A worker's report, by its ``kind``."""
    return decode_family(REPORTS, "kind", "report", wire)


def decode_message(wire: Any) -> Message:
    """A message on a worker's watch stream, by its ``type``."""
    return decode_family(MESSAGES, "type", "message", wire)
