"""A node of a multi-node job other than the controller's: ``torchrelay run --node-rank R``.

It runs a :class:`NodeAgent` for its workers and spares and connects it to the controller on
node 0 over the control RPC: exits are reported as ``NodeExit``; ``start_spare``, ``fence`` and
``finish`` arrive on ``NodeWatch``. If this process dies, the controller sees the stream drop
and treats every process of this node as lost.
"""

from __future__ import annotations

import sys

from torchrelay.agent.agent import NodeAgent
from torchrelay.config import JobConfig
from torchrelay.control.service import ControlClient, ControlError


class RemoteNode:
    """Node ``config.node_rank`` of a job whose controller listens at ``control``."""

    def __init__(self, config: JobConfig, control: str, token: str) -> None:
        self.config = config
        self.node = f"node{config.node_rank}"
        self.client = ControlClient(control, token, process=f"agent@{self.node}")
        self.agent = NodeAgent(config, self.node, on_exit=self._on_exit)
        self.agent.configure(config.master_port, control, token)

    def _on_exit(self, process: str, returncode: int) -> None:
        try:
            self.client.node_exit(self.node, process, returncode)
        except ControlError as exc:
            print(f"torchrelay: could not report the exit of {process}: {exc}", file=sys.stderr)

    def run(self) -> int:
        """Serve the controller's commands until the job finishes; 0 on success."""
        self.client.node_join(self.node)
        self.agent.start_workers()
        for _ in range(self.config.spares):
            self.agent.start_spare()
        try:
            for command in self.client.node_watch(self.node):
                if command["type"] == "start_spare":
                    self.agent.start_spare()
                elif command["type"] == "fence":
                    self.agent.fence(str(command["process"]))
                elif command["type"] == "finish":
                    finished = self.agent.wait_all(timeout=30.0)
                    return 0 if finished else 1
        except ControlError as exc:
            print(f"torchrelay: lost the controller ({exc}); stopping this node", file=sys.stderr)
        self.agent.stop_all()
        return 1
