"""Chaos drills: an operator's ``torchrelay chaos`` and the scheduled ``--chaos`` faults.

Process faults are carried out by the target's node agent (a signal); node faults
(``partition``, ``kill-node``) by the target node's agent, which says what it does (a notice,
:func:`on_notice`) before doing it. Rank faults of ``--chaos`` are fired by the workers
themselves: the controller hands each its pending events and records them when fired.
"""

from __future__ import annotations

import signal
from typing import Any

from torchrelay import events
from torchrelay.chaos import NODE_ACTIONS
from torchrelay.control.actions import Action, Record, SendToNode
from torchrelay.control.errors import ProtocolError
from torchrelay.control.nodes import node_of
from torchrelay.control.nodes import signal as signal_process
from torchrelay.control.protocol import Chaos, ChaosNotice
from torchrelay.control.state import GONE, JobState, NodeEntry

PROCESS_FAULTS = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}


def chaos_for(job: JobState, slot: int | None) -> list[dict[str, Any]]:
    """The pending ``--chaos`` events a worker of ``slot`` fires itself."""
    if slot is None:
        return []
    return [e.to_dict() for e in job.chaos_pending.values() if e.rank == slot]


def inject_process(job: JobState, fault: str, process: str) -> list[Action]:
    """``kill`` or ``hang`` (SIGKILL / SIGSTOP) the process ``process``."""
    member = job.member(process)
    if member.state in GONE:
        raise ProtocolError(f"{process} is not running ({member.state.value})")
    requested = Record(events.ChaosRequested(fault=fault, process=process))
    return [requested, *signal_process(job, process, PROCESS_FAULTS[fault])]


def inject_node(job: JobState, fault: str, node: str, seconds: float) -> list[Action]:
    """``partition`` (for ``seconds``) or ``kill-node`` the node ``node``; the controller's own
    node is refused, since losing it ends the job (the controller is not replicated)."""
    if fault not in NODE_ACTIONS:
        raise ProtocolError(f"unknown fault {fault!r}")
    if node == job.leader_node:
        raise ProtocolError(
            f"{node} hosts the controller: cutting or killing it ends the job, there is "
            "nothing to recover to; drill another node"
        )
    entry = node_of(job, node)
    if not entry.alive:
        raise ProtocolError(f"{node} is already lost")
    if fault == "partition" and not 1.0 <= seconds <= 3600.0:
        raise ProtocolError("a partition lasts between 1 and 3600 seconds")
    entry.chaos_notice = None
    return _send_node_fault(entry, fault, seconds)


def _send_node_fault(entry: NodeEntry, fault: str, seconds: float) -> list[Action]:
    requested = events.ChaosRequested(fault=fault, node=entry.name, seconds=seconds)
    return [Record(requested), SendToNode(entry.name, Chaos(fault=fault, seconds=seconds))]


def on_notice(entry: NodeEntry, notice: ChaosNotice) -> list[Action]:
    """The node's agent says what it does about a drill (or why it cannot)."""
    entry.chaos_notice = notice.details()
    injected = events.ChaosInjected(
        node=entry.name,
        fault=notice.fault,
        ok=notice.ok,
        interfaces=notice.interfaces,
        seconds=notice.seconds,
        error=notice.error,
    )
    return [Record(injected)]


def fire_node_chaos(job: JobState) -> list[Action]:
    """Scheduled node faults (``--chaos kill-node|partition:node=N:step=S``) go out once
    some rank has committed step S-1, i.e. while the job runs step S."""
    actions: list[Action] = []
    for event in list(job.chaos_pending.values()):
        entry = job.nodes.get(f"node{event.node}")
        due = event.action in NODE_ACTIONS and event.step <= job.highest_committed + 1
        if due and entry is not None and entry.alive:
            del job.chaos_pending[event.id]
            fired = events.ChaosFired.of(f"agent@{entry.name}", event)
            actions += [Record(fired), *_send_node_fault(entry, event.action, event.seconds)]
    return actions
