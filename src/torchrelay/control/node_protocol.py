"""What node agents and the controller say to each other (re-exported by
:mod:`torchrelay.control.protocol`, whose conventions it follows).

* node agent -> controller (``NodeReport``, key ``kind``): ``heartbeat``, ``exit``, ``health``,
  ``chaos`` (its notice about a drill), ``copied`` (a transparent copy's outcome); plus
  :class:`NodeJoin` and :class:`NodeJoinAnswer`;
* controller -> node agent (``Command``, key ``type``): ``start_spare``, ``signal``, ``chaos``,
  ``copy``, ``finish``.

:func:`decode_node_report` and :func:`decode_command` dispatch on the key and raise
:class:`ProtocolError` with one line. Imports neither torch nor the controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torchrelay.chaos import NODE_ACTIONS
from torchrelay.control.protocol_base import GENERATION, Wire, decode_family
from torchrelay.event_base import Event
from torchrelay.events_criu import parse_outcome
from torchrelay.ledger import LedgerError
from torchrelay.typed import at_least, optional, registry

COPY_KINDS = ("clone", "migrate")


# --------------------------------------------------------------------- node agent -> controller
@dataclass(frozen=True, kw_only=True)
class NodeJoin(Wire):
    node: str


@dataclass(frozen=True, kw_only=True)
class NodeJoinAnswer(Wire):
    world_size: int = at_least(1, "a world size (an integer >= 1)")
    node_timeout: float = at_least(0.0, "a timeout in seconds (>= 0)")


@dataclass(frozen=True, kw_only=True)
class NodeReport(Wire):
    KEY: ClassVar[str] = "kind"


@dataclass(frozen=True, kw_only=True)
class NodeHeartbeat(NodeReport):
    TAG: ClassVar[str] = "heartbeat"


@dataclass(frozen=True, kw_only=True)
class NodeExit(NodeReport):
    """Process ``exited`` ended with ``returncode`` (negative: killed by that signal)."""

    TAG: ClassVar[str] = "exit"
    exited: str
    returncode: int


@dataclass(frozen=True, kw_only=True)
class HealthReport(NodeReport):
    """One poll of the node's health readings (see :class:`torchrelay.health.Reading`; each is
    checked by the controller when it reads them)."""

    TAG: ClassVar[str] = "health"
    readings: tuple[dict[str, Any], ...]


@dataclass(frozen=True, kw_only=True)
class ChaosNotice(NodeReport):
    """What the agent does about a node drill: ``ok`` (with the interfaces it cuts and for how
    long), or why it cannot (``error``)."""

    TAG: ClassVar[str] = "chaos"
    fault: str
    ok: bool
    interfaces: tuple[str, ...] | None = optional()
    seconds: float | None = optional()
    error: str | None = optional()

    def details(self) -> dict[str, Any]:
        """The notice as the operator's ``torchrelay chaos`` and the ledger show it."""
        return {k: v for k, v in self.to_wire().items() if k != self.KEY}


@dataclass(frozen=True, kw_only=True)
class CopyOutcome(NodeReport):
    """The outcome of a :class:`CopyProcess`: the ledger event the agent's copy ended with
    (``replica_cloned``, ``worker_migrated`` or ``copy_failed``), checked as the ledger's."""

    TAG: ClassVar[str] = "copied"
    event: dict[str, Any]

    def __post_init__(self) -> None:
        super().__post_init__()
        self.outcome()

    def outcome(self) -> Event:
        """The typed event (:class:`ProtocolError` if it is not a copy's outcome)."""
        try:
            return parse_outcome(self.event)
        except LedgerError as exc:
            self._refuse(str(exc))


# --------------------------------------------------------------------- controller -> node agent
@dataclass(frozen=True, kw_only=True)
class Command(Wire):
    KEY: ClassVar[str] = "type"


@dataclass(frozen=True, kw_only=True)
class StartSpare(Command):
    """Start a spare, on none of the ``avoid`` devices (quarantined: judged unhealthy)."""

    TAG: ClassVar[str] = "start_spare"
    avoid: tuple[int, ...] | None = optional()


@dataclass(frozen=True, kw_only=True)
class Signal(Command):
    TAG: ClassVar[str] = "signal"
    process: str
    signal: int = at_least(1, "a signal number (an integer >= 1)")
    # True: send it once the process has dumped its stacks (stack_dump); off the wire if not.
    stacks: bool | None = optional()


@dataclass(frozen=True, kw_only=True)
class Chaos(Command):
    """Carry out a node drill: ``partition`` for ``seconds``, or ``kill-node``."""

    TAG: ClassVar[str] = "chaos"
    fault: str
    seconds: float = at_least(0.0, "a duration (>= 0)", default=0.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fault not in NODE_ACTIONS:
            self._refuse(f"unknown node fault {self.fault!r}")


@dataclass(frozen=True, kw_only=True)
class CopyProcess(Command):
    """Transparent mode: once ``process`` of this node (told to park) waits on its park channel,
    ``clone`` it into a new spare of this node that will take ``slot``, or ``migrate`` it into a
    copy of itself; answered by a :class:`CopyOutcome` (see :mod:`torchrelay.agent.cloning`)."""

    TAG: ClassVar[str] = "copy"
    kind: str
    process: str
    slot: int = at_least(0, "a slot (an integer >= 0)")
    generation: int = at_least(0, GENERATION)
    ordered: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in COPY_KINDS:
            self._refuse(f"unknown kind of copy {self.kind!r} (expected one of {COPY_KINDS})")


@dataclass(frozen=True, kw_only=True)
class Seated(Command):
    """Spare ``process`` of this node now serves ``slot``: its output is shown as that rank's
    (:mod:`torchrelay.agent.console`). Said for information only; nothing waits on it."""

    TAG: ClassVar[str] = "seated"
    process: str
    slot: int = at_least(0, "a slot (an integer >= 0)")


@dataclass(frozen=True, kw_only=True)
class FinishNode(Command):
    """The job is over: the node agent stops serving (``{"type": "finish"}`` as for workers).

    ``joined`` names the node's processes that joined the job: they were told the job is over
    and exit by themselves. Any other process of the node is a spare still starting, which
    the agent stops rather than wait for it to come up only to be dismissed. Left out (a
    failed job's nodes stop everything anyway): the agent waits for every process."""

    TAG: ClassVar[str] = "finish"
    joined: tuple[str, ...] | None = optional()


NODE_REPORTS = registry(NodeHeartbeat, NodeExit, HealthReport, ChaosNotice, CopyOutcome)
COMMANDS = registry(StartSpare, Signal, Chaos, CopyProcess, Seated, FinishNode)


def decode_node_report(wire: Any) -> NodeReport:
    """A node agent's report, by its ``kind``."""
    return decode_family(NODE_REPORTS, "kind", "node report", wire)


def decode_command(wire: Any) -> Command:
    """A command on a node agent's stream, by its ``type``."""
    return decode_family(COMMANDS, "type", "command", wire)
