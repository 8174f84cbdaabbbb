"""The node registry: remote node agents joining, and reaching a process through its node.

The controller's own node (``JobState.local_node``) is not in the registry: its agent is called
directly (:class:`~torchrelay.control.actions.SignalLocal`). A remote node is alive until it is
declared lost (see :func:`torchrelay.control.departures.node_lost`); it may then join again as a
new node entry with an empty command stream.
"""

from __future__ import annotations

from torchrelay.control.actions import Action, Record, SendToNode, SignalLocal
from torchrelay.control.errors import ProtocolError
from torchrelay.control.protocol import Signal
from torchrelay.control.state import JobState, NodeEntry
from torchrelay.events import NodeJoined


def join_node(job: JobState, node: str, now: float) -> list[Action]:
    """A remote node agent registers; refused for a node that is already part of the job."""
    if node == job.local_node or (node in job.nodes and job.nodes[node].alive):
        raise ProtocolError(f"node {node!r} is already part of the job")
    job.nodes[node] = NodeEntry(node, last_seen=now)
    return [Record(NodeJoined(node=node))]


def node_of(job: JobState, node: str) -> NodeEntry:
    entry = job.nodes.get(node)
    if entry is None:
        raise ProtocolError(f"node {node!r} never joined")
    return entry


def signal(job: JobState, process: str, signum: int, stacks: bool = False) -> list[Action]:
    """Have the agent of ``process``'s node send it ``signum`` (nothing if that node is lost:
    nobody can reach the process, and its node's agent kills it when its lease runs out).
    ``stacks``: once the process has written its threads' stacks to its log (a fence for a
    hang or a stall; :mod:`torchrelay.stack_dump`)."""
    member = job.members.get(process)
    node = member.node if member is not None else job.local_node
    if node is not None and node == job.local_node:
        return [SignalLocal(process, signum, stacks)]
    if node in job.nodes and job.nodes[node].alive:
        return [SendToNode(node, Signal(process=process, signal=signum, stacks=stacks or None))]
    return []
