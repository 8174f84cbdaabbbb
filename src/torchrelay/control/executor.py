"""Carries out the transitions' actions: the one place where decisions touch the world.

It owns what cannot be plain state: the outbox of every process and node agent (their watch
streams read them), the local node agent, the ledger and the refused-request counter. Actions
are applied in order, under the controller's lock; none of them blocks (an outbox put and a
ledger append return at once, the agent only sends a signal or starts a process; a transparent
copy runs on a thread of its own and comes back through ``copied``). A copy on another node
is no action of its own here: it goes to that node's agent as a ``copy`` command
(:class:`SendToNode`), whose outcome comes back as the agent's report.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from torchrelay.control.actions import (
    Action,
    AskPool,
    CloneReplica,
    EndJob,
    MigrateWorker,
    QuarantineDevice,
    Record,
    Send,
    SendToNode,
    SignalLocal,
    StartLocalSpare,
    StartRecovery,
)
from torchrelay.control.outbox import Outbox
from torchrelay.control.protocol import StartSpare
from torchrelay.control.rejections import Rejections
from torchrelay.events import Event, JobEnd
from torchrelay.health import quarantine
from torchrelay.health.log import log_stderr
from torchrelay.ledger import Ledger


class AgentHandle(Protocol):
    """What the controller needs from the node agent on its own node."""

    def start_spare(self) -> None: ...

    def kill(self, process: str, signum: int = signal.SIGKILL, stacks: bool = False) -> None: ...

    def clone_replica(self, action: CloneReplica) -> Event:
        """Transparent mode: carry out ``action`` (blocks); the outcome as a ledger event."""
        ...

    def migrate_worker(self, action: MigrateWorker) -> Event:
        """Transparent mode: carry out ``action`` (blocks); the outcome as a ledger event."""
        ...


class Executor:
    """Applies actions; ``start_recovery`` is called for :class:`StartRecovery`, ``observe``
    (the metrics, see :mod:`torchrelay.control.metrics`) with every event it writes to the
    ledger, after it is written."""

    def __init__(
        self,
        ledger: Ledger,
        agent: AgentHandle,
        rejections: Rejections,
        start_recovery: Callable[[], None],
        observe: Callable[[Event], None] | None = None,
        copied: Callable[[Event], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.agent = agent
        self.rejections = rejections
        self._start_recovery = start_recovery
        self._observe = observe
        # --pool: sends a request for replacement slots (set by the launcher's pool link).
        self.ask_pool: Callable[[int], None] = _no_pool
        self._copied = copied
        self.process_outboxes: dict[str, Outbox] = {}
        self.node_outboxes: dict[str, Outbox] = {}

    def outbox(self, process: str) -> Outbox:
        """The outbox of ``process``, made on first use (a process joins once)."""
        return _made(self.process_outboxes, process)

    def node_outbox(self, node: str) -> Outbox:
        """The outbox of node agent ``node``, made on first use."""
        return _made(self.node_outboxes, node)

    def open_node(self, node: str) -> None:
        """A node agent joined (again): a fresh outbox, its old stream is over."""
        self.node_outboxes[node] = Outbox()

    def apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.outbox(action.process).put(action.message.to_wire())
            elif isinstance(action, SendToNode):
                command = action.command
                if isinstance(command, StartSpare):
                    avoided = quarantine.devices_of(self.ledger.path.parent, action.node)
                    command = StartSpare(avoid=tuple(sorted(avoided)) or None)
                self.node_outbox(action.node).put(command.to_wire())
            elif isinstance(action, SignalLocal):
                self.agent.kill(action.process, action.signum, action.stacks)
            elif isinstance(action, StartLocalSpare):
                self.agent.start_spare()
            elif isinstance(action, AskPool):
                self.ask_pool(action.slots)
            elif isinstance(action, Record):
                self._record(action.event)
            elif isinstance(action, EndJob):
                counts = self.rejections.counts()
                self._record(JobEnd(**action.outcome, rejected_requests=counts))
            elif isinstance(action, StartRecovery):
                self._start_recovery()
            elif isinstance(action, QuarantineDevice):
                self._quarantine(action)
            elif isinstance(action, CloneReplica | MigrateWorker):
                # A copy takes seconds: never under the controller's lock.
                threading.Thread(target=self._clone, args=(action,), daemon=True).start()
            else:
                raise TypeError(f"unknown action {action!r}")

    def _clone(self, action: CloneReplica | MigrateWorker) -> None:
        if isinstance(action, CloneReplica):
            outcome = self.agent.clone_replica(action)
        else:
            outcome = self.agent.migrate_worker(action)
        if self._copied is not None:
            self._copied(outcome)

    def _quarantine(self, action: QuarantineDevice) -> None:
        entry = quarantine.Quarantined(
            node=action.node, device=action.device, reason=action.reason, t=time.time()
        )
        try:
            quarantine.update(self.ledger.path.parent, lambda q: quarantine.quarantined(q, entry))
        except (OSError, quarantine.QuarantineError) as exc:
            log_stderr(f"could not quarantine {entry.where()}: {exc}")

    def _record(self, event: Event) -> None:
        self.ledger.write(event.to_json())
        if self._observe is not None:
            self._observe(event)


def _no_pool(slots: int) -> None:
    raise RuntimeError(f"asked a pool for {slots} slot(s), but no pool link is attached")


def _made(outboxes: dict[str, Outbox], name: str) -> Outbox:
    """``outboxes[name]``, made if there is none (not ``setdefault``, which would make one
    for every message sent)."""
    outbox = outboxes.get(name)
    if outbox is None:
        outbox = outboxes[name] = Outbox()
    return outbox
