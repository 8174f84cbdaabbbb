"""What a transition asks the outside world to do, as plain values.

Transitions (membership, departures, liveness, recovery_steps, drills, nodes) decide and return
a list of these; :class:`torchrelay.control.executor.Executor` carries them out in order. A
transition that refuses a request raises :class:`Refused`, with the actions (a ledger line) to
carry out before the caller gets the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchrelay.control.protocol import Command, Message
from torchrelay.events import Event


@dataclass(frozen=True)
class Send:
    """Put ``message`` (abort, plan, finish) on ``process``'s watch stream."""

    process: str
    message: Message


@dataclass(frozen=True)
class SendToNode:
    """Put ``command`` (start_spare, signal, chaos, finish) on a remote node agent's stream."""

    node: str
    command: Command


@dataclass(frozen=True)
class SignalLocal:
    """Have the controller's own node agent send ``signum`` to ``process`` (``stacks``: once
    it has dumped its stacks, see :mod:`torchrelay.stack_dump`)."""

    process: str
    signum: int
    stacks: bool = False


@dataclass(frozen=True)
class StartLocalSpare:
    """Have the controller's own node agent start one spare process."""


@dataclass(frozen=True)
class AskPool:
    """Ask the job's pool for ``slots`` replacement slots (a grant starts a spare there)."""

    slots: int


@dataclass(frozen=True)
class Record:
    """Append ``event`` to the ledger."""

    event: Event


@dataclass(frozen=True)
class EndJob:
    """The job ended with ``outcome``: record ``job_end`` (with the refused-request counts)."""

    outcome: dict[str, Any]


@dataclass(frozen=True)
class StartRecovery:
    """Make sure the recovery coordinator runs (it decides from the state what to do)."""


@dataclass(frozen=True)
class QuarantineDevice:
    """Record ``node``'s ``device`` as unhealthy (``RUN_DIR/quarantine.json``): no spare is
    started on it until an operator clears it (``torchrelay uncordon``)."""

    node: str
    device: int
    reason: str


@dataclass(frozen=True)
class CloneReplica:
    """Transparent mode: once ``donor`` (told to park) waits on its park channel, have the
    controller's node agent copy it into a new spare that will take ``slot`` (see
    :mod:`torchrelay.agent.cloning`); the outcome comes back as a ledger event. A donor on
    another node is copied by its own agent instead (a :class:`~torchrelay.control.protocol.
    CopyProcess` sent to it)."""

    donor: str
    slot: int
    generation: int
    ordered: float


@dataclass(frozen=True)
class MigrateWorker:
    """Transparent mode: once ``process`` (told to park at a handover's boundary) waits on its
    park channel, have the controller's node agent move it into a restored copy of itself
    (same name and slot); the outcome comes back as a ledger event. A worker of another node
    is moved by its own agent (a :class:`~torchrelay.control.protocol.CopyProcess`)."""

    process: str
    slot: int
    generation: int
    ordered: float


Action = (
    Send
    | SendToNode
    | SignalLocal
    | StartLocalSpare
    | AskPool
    | Record
    | EndJob
    | StartRecovery
    | QuarantineDevice
    | CloneReplica
    | MigrateWorker
)


class Refused(Exception):
    """A transition refused a request: carry out ``actions``, then raise ``error``."""

    def __init__(self, error: Exception, actions: list[Action]) -> None:
        super().__init__(str(error))
        self.error = error
        self.actions = actions
