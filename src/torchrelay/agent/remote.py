"""A node of a multi-node job other than the controller's: ``torchrelay run --node-rank R``.

It runs a :class:`NodeAgent` for its workers and spares and connects it to the controller on
node 0 over the control RPC: heartbeats and process exits go out as ``NodeReport``;
``start_spare``, ``signal`` (fences and drills), ``chaos``, ``copy`` and ``finish`` arrive on
``NodeWatch``. A ``copy`` (transparent mode: clone a parked replica into a spare of this node,
or move a drained worker into a copy of itself, see :mod:`torchrelay.agent.cloning`) takes
seconds: it runs on a thread of its own, and its outcome goes back as a ``copied`` report.

If this process dies, the controller sees the stream drop; if it is cut off, the controller
sees its heartbeats stop. Either way every process of the node is declared lost. A cut-off
agent holds a lease (:mod:`torchrelay.control.lease`): once it expires, the agent kills its
workers and exits, so an isolated node never rejoins the job with stale state. SIGTERM and
SIGINT stop this node's workers and spares, and the agent exits 143 / 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

from torchrelay.agent import partition
from torchrelay.agent.agent import NodeAgent
from torchrelay.agent.console import Seats
from torchrelay.agent.signals import ALONGSIDE, STOP_SIGNALS, StopSignals, exit_status
from torchrelay.agent.standby import Standby
from torchrelay.config import JobConfig
from torchrelay.control.actions import CloneReplica, MigrateWorker
from torchrelay.control.client import ControlClient, ControlError
from torchrelay.control.endpoint import Endpoint, failover_for
from torchrelay.control.lease import HEARTBEAT_RPC_TIMEOUT, keep_alive
from torchrelay.control.protocol import (
    Chaos,
    ChaosNotice,
    CopyOutcome,
    CopyProcess,
    FinishNode,
    HealthReport,
    NodeExit,
    NodeHeartbeat,
    ProtocolError,
    Seated,
    Signal,
    StartSpare,
)
from torchrelay.event_base import Event
from torchrelay.events_criu import CopyFailed


class RemoteNode:
    """Node ``config.node_rank`` of a job whose controller listens at ``control``."""

    def __init__(self, config: JobConfig, control: str, token: str) -> None:
        self.config = config
        self.control = control
        self.node = f"node{config.node_rank}"
        self.token = token
        self.client = ControlClient(
            control,
            token,
            process=f"agent@{self.node}",
            failover=failover_for(str(config.state), token),
            on_failover=self._follow,
        )
        self.seats = Seats()
        self.agent = NodeAgent(config, self.node, on_exit=self._on_exit, seat=self.seats.of)
        self.agent.configure(config.master_port, control, token)
        self.standby: Standby | None = None
        self._stop = StopSignals()
        self._stopped = threading.Event()
        self._isolated: str | None = None
        self._finished = False  # the controller said the job is over

    def _say(self, message: str) -> None:
        # Never raises: whoever read our stderr may be gone, and this node must still stop.
        with contextlib.suppress(OSError):
            os.write(2, f"torchrelay [{self.node}]: {message}\n".encode(errors="replace"))

    def _follow(self, endpoint: Endpoint) -> None:
        """A new leader took over: processes started from now on go to it."""
        self.control = endpoint.control
        host, _, port = endpoint.store.rpartition(":")
        self.agent.configure(int(port), endpoint.control, self.token, store_host=host)
        self._say(f"following the new leader at {endpoint.control} (term {endpoint.term})")

    def _report_health(self, readings: tuple[dict[str, Any], ...]) -> None:
        if self._isolated is not None or self._stopped.is_set():
            return
        try:
            report = HealthReport(readings=readings)
            self.client.node_report(self.node, report, timeout=HEARTBEAT_RPC_TIMEOUT)
        except ControlError as exc:
            self._say(f"could not report this node's health readings: {exc}")

    def _on_exit(self, process: str, returncode: int) -> None:
        if -returncode in STOP_SIGNALS and not self._stopped.is_set():
            self._stop.follows(ALONGSIDE)  # is it this node's stop? (see signals.ALONGSIDE)
        if self._isolated is not None or self._stop.received is not None:
            return
        try:
            self.client.node_report(self.node, NodeExit(exited=process, returncode=returncode))
        except ControlError as exc:
            self._say(f"could not report the exit of {process}: {exc}")

    def run(self) -> int:
        """Serve the controller's commands until the job finishes; 0 on success, 1 when the
        controller is gone or this node was cut off, 128 + N when signal N (SIGTERM, SIGINT)
        stopped it. This node's workers and spares are stopped in every case."""
        joined = self.client.node_join(self.node)
        if self.client.fails_over:
            # Joined: the job has its leader, so a standby can only ever succeed it.
            self.standby = Standby(self.config, self.node, self.token, self.agent)
            self.standby.start()
        status = 1
        try:
            status = self._run(joined.node_timeout)
        finally:
            self.agent.stop_health()
            led = self._stand_down()
        return status if led in (None, "succeeded") else max(status, 1)

    def _stand_down(self) -> str | None:
        """Stop campaigning; if this node led the job, close it and return how it ended."""
        outcome = None if self.standby is None else self.standby.close()
        if outcome is None:
            return None
        self._say(f"the job this node led ended: {outcome['status']}")
        return str(outcome["status"])

    def _run(self, node_timeout: float) -> int:
        with self._stop as stop:
            self.agent.watch_health(self._report_health)
            self.agent.start_workers()
            for _ in range(self.config.spares):
                self.agent.start_spare()
            heartbeat = threading.Thread(
                target=self._heartbeat,
                args=(node_timeout,),
                name="torchrelay-node-heartbeat",
                daemon=True,
            )
            heartbeat.start()
            serving = threading.Thread(
                target=self._serve, name="torchrelay-node-commands", daemon=True
            )
            serving.start()
            while serving.is_alive() and stop.received is None:
                serving.join(timeout=0.2)
            if stop.received is not None:
                self._say(f"received {stop.name}: stopping this node's workers and spares")
                self._stopped.set()
                self.client.close()  # the controller sees this node leave at once
                self.agent.stop_all()
                serving.join(timeout=5.0)
                return exit_status(stop.name)
        if self._finished and self.agent.wait_all(timeout=30.0):
            return 0
        if self._isolated is not None:
            self._say(self._isolated)
        self.agent.stop_all()
        return 1

    def _serve(self) -> None:
        """Carry out the controller's commands until ``finish`` or the stream breaks."""
        try:
            for command in self.client.node_watch(self.node):
                if isinstance(command, StartSpare):
                    self.agent.start_spare(command.avoid or ())
                elif isinstance(command, Signal):
                    self.agent.kill(command.process, command.signal, bool(command.stacks))
                elif isinstance(command, Chaos):
                    self._chaos(command)
                elif isinstance(command, CopyProcess):
                    copying = threading.Thread(
                        target=self._copy, args=(command,), name="torchrelay-copy", daemon=True
                    )
                    copying.start()
                elif isinstance(command, Seated):
                    self.seats.take(command.process, command.slot)
                    self.agent.console.release(command.process)
                elif isinstance(command, FinishNode):
                    self._finished = True
                    if command.joined is not None:
                        self.agent.dismiss_unjoined(command.joined)
                    return
        except (ControlError, ProtocolError) as exc:
            if self._isolated is None and self._stop.received is None:
                self._say(f"lost the controller ({exc}); stopping this node")
        finally:
            self._stopped.set()

    def _copy(self, command: CopyProcess) -> None:
        """Carry out a copy as the controller's own agent does, and send its outcome back (a
        failed copy is a ``copy_failed`` outcome, never an exception)."""
        order = (command.process, command.slot, command.generation, command.ordered)
        outcome: Event
        try:
            if command.kind == "clone":
                outcome = self.agent.clone_replica(CloneReplica(*order))
            else:
                outcome = self.agent.migrate_worker(MigrateWorker(*order))
        except KeyError:  # not one of this agent's processes (it started again meanwhile)
            why = f"{command.process} is no process of {self.node}'s agent"
            outcome = CopyFailed(process=command.process, kind=command.kind, reason=why)
        if self._isolated is not None or self._stopped.is_set():
            return  # nobody to tell: this node is out of the job
        try:
            self.client.node_report(self.node, CopyOutcome(event=outcome.to_json()))
        except ControlError as exc:
            self._say(f"could not report the copy of {command.process}: {exc}")

    def _heartbeat(self, node_timeout: float) -> None:
        def beat() -> float:
            self.client.node_report(self.node, NodeHeartbeat(), timeout=HEARTBEAT_RPC_TIMEOUT)
            return node_timeout

        def refused(error: ControlError) -> None:
            if error.code == "FAILED_PRECONDITION":
                self._isolate(f"the controller fenced this node out ({error.message})")

        def expired(silence: float, lease: float, error: ControlError) -> None:
            self._isolate(
                f"cut off from the controller for {silence:.1f} s (node timeout {lease:.1f} s, "
                f"last error {error.code}): the job has given this node's slots to others"
            )

        keep_alive(beat, self._stopped, refused, expired)

    def _isolate(self, why: str) -> None:
        """Kill every worker and spare of this node and stop serving the controller."""
        if self._isolated is not None:
            return
        self._isolated = f"{why}; killed this node's workers so they cannot rejoin stale"
        self._stopped.set()
        self.agent.kill_all()
        self.client.close()  # ends the command stream in run()

    def _chaos(self, command: Chaos) -> None:
        fault, seconds = command.fault, command.seconds
        if fault == "kill-node":
            self._notify_chaos(ChaosNotice(fault=fault, ok=True))
            self._say("chaos kill-node: SIGKILL to every process of this node, this agent last")
            self.agent.kill_all()
            os.kill(os.getpid(), signal.SIGKILL)
            return
        try:
            partition.check_cuttable(self.control)
            names = partition.prepare()
        except partition.PartitionError as exc:
            self._notify_chaos(ChaosNotice(fault=fault, ok=False, error=str(exc)))
            self._say(f"chaos partition refused: {exc}")
            return
        # Said before the cut: afterwards nothing gets through.
        self._notify_chaos(
            ChaosNotice(fault=fault, ok=True, interfaces=tuple(names), seconds=seconds)
        )
        self._say(f"chaos partition: dropping all traffic on {names} for {seconds:.0f} s")
        try:
            partition.cut(names, seconds)
        except partition.PartitionError as exc:
            self._notify_chaos(ChaosNotice(fault=fault, ok=False, error=str(exc)))

    def _notify_chaos(self, notice: ChaosNotice) -> None:
        with contextlib.suppress(ControlError):
            self.client.node_report(self.node, notice, timeout=5.0)
