"""Transparent mode: a worker parks to be copied by its node agent, then reconnects.

A mixin of :class:`torchrelay.runtime.relay.Relay`. On a :class:`Park` message, read by the
training thread where it waits for a plan (a step boundary: the step in flight was voided),
:meth:`Parking._park`:

1. pauses the heartbeat and watch threads (:attr:`_unparked` cleared; no RPC left in flight);
2. drops every socket: the communicator (and the retired ones), the TCPStore client and the
   ``PrefixStore`` over it that c10d's world keeps for the default group, the gRPC channel;
3. waits on the park channel (:func:`torchrelay.transparent.park.wait`), where the agent dumps
   it: a clone's donor, or a drained worker that moves;
4. reconnects as what the instruction says: ``CONTINUE`` -- the same process; ``BECOME`` -- a
   spare named in the instruction's environment (the copy of a donor), which joins the
   controller and reports ready, so the ordinary recovery plan gives it the dead slot;
5. reports again what it waits with (a halt, or a spare's ready) and goes on waiting.

A broken park channel (the agent died) ends the process with one line, as a lost controller
does.
"""

from __future__ import annotations

import gc
import os
import threading
from typing import Any

import torch.distributed as dist

from torchrelay.control.client import ControlClient
from torchrelay.control.endpoint import failover_for
from torchrelay.control.protocol import Ready, Report
from torchrelay.exits import EXIT_CONTROLLER_LOST, leave
from torchrelay.runtime import default_group
from torchrelay.runtime.env import RelayEnv, host_pid
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.posting import Poster
from torchrelay.transparent import park

# How long the watch thread may take to notice its stream was closed (it is at once).
_WATCH_PAUSE = 30.0


class Parking:
    """Park, be copied, reconnect (see the module doc)."""

    env: RelayEnv
    generation: int
    rank: int | None
    process_group: StableProcessGroup
    _client: ControlClient
    _store: Any
    _store_address: str
    _timeout: Any
    _retired: list[dist.ProcessGroup]
    _waiting: Report | None
    _state_valid: bool
    _unparked: threading.Event  # cleared while parked: heartbeats and the watch wait
    _beating: threading.Lock  # held by a heartbeat's RPC
    _watch_paused: threading.Event  # the watch thread noticed the park
    _poster: Poster

    def _park(self) -> None:
        self._poster.flush()  # what was posted goes out before the connection closes
        self._unparked.clear()
        with self._beating:
            pass  # the heartbeat in flight, if any, is over; none starts while parked
        self._drop_sockets()
        if not self._watch_paused.wait(_WATCH_PAUSE):
            leave(EXIT_CONTROLLER_LOST, "the watch stream did not stop for the park")
        try:
            instruction = park.wait(self.env.token)
        except park.ParkError as exc:
            leave(EXIT_CONTROLLER_LOST, f"park failed: {exc}")
        if instruction.kind is park.Kind.BECOME:
            os.environ.update(instruction.env)
            os.environ["TORCHRELAY_CONTROL"] = instruction.endpoint or self.env.control
            self.env = RelayEnv.from_environ()
        self._reconnect(instruction.store or self._store_address)
        if instruction.kind is park.Kind.BECOME:
            self._become_spare()
        self._watch_paused.clear()
        self._unparked.set()
        if self._waiting is not None:
            self._send(self._waiting)  # type: ignore[attr-defined]

    def _drop_sockets(self) -> None:
        """Close every socket this process holds (CRIU cannot copy a connection)."""
        self.process_group.unbind()
        self._retired.clear()
        default_group.set_store(self.process_group, None)
        self._store = None
        self._client.close()
        gc.collect()  # gloo closes its sockets when the last reference goes

    def _reconnect(self, store: str) -> None:
        env = self.env
        self._client = ControlClient(
            env.control, env.token, env.process, failover=failover_for(env.state, env.token)
        )
        self._client.on_failover = self._on_new_leader  # type: ignore[attr-defined]
        host, _, port = store.rpartition(":")
        self._store = dist.TCPStore(host, int(port), is_master=False, timeout=self._timeout)
        self._store_address = store
        default_group.set_store(self.process_group, dist.PrefixStore("default_pg", self._store))

    def _become_spare(self) -> None:
        """A copy: join under the spare's name; the plan gives it its slot and generation."""
        env = self.env
        joined = self._client.join(env.role, host_pid(), env.node, None, device=env.local_rank)
        self.generation, self.rank, self._state_valid = joined.generation, None, False
        self._waiting = Ready()
