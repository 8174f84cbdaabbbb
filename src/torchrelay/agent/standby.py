"""A standby controller on a node other than the leader's: campaigns, and takes over on winning.

With ``--state etcd://...`` every node's launcher (``torchrelay run --node-rank R``, R > 0) runs
a :class:`Standby` beside its node agent, once the node has joined the job (the job has a
leader then, so a standby can never lead a job from its start). It campaigns for the lead
(:meth:`StateBackend.campaign`: an etcd lease); it wins only when the leader's lease ran out
(its host died, was cut off, or the launcher was killed) or the leader resigned at the job's end.

On winning a running job's lead it becomes the controller, in this process:

1. reads the durable state (:meth:`StatePersister.resume`) -- none, or an ended job: it
   resigns and stops;
2. serves a new rendezvous store and the control RPC on this node's address towards the
   rendezvous host (:func:`address_towards`), on free ports;
3. :meth:`Controller.take_over` (see :mod:`torchrelay.control.takeover`): the old leader's
   node is lost, a recovery in flight is planned again in the new store;
4. publishes its :class:`Endpoint`, fenced by its term: every process's client
   (:class:`ControlClient` with a :class:`Failover`) moves to it, this node's agent included.

Failure behaviour: a store that does not answer while campaigning is retried (the job may still
have its leader); one that fails while taking over ends the takeover with one line on stderr
(the state was not changed by it, and another standby may still win once this one's lease runs
out). Writing to the state store afterwards is fenced as for any leader
(:mod:`torchrelay.control.persistence`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from pathlib import Path
from typing import Any

from torchrelay.agent.agent import NodeAgent
from torchrelay.agent.rendezvous import address_towards, bind_rendezvous, serve_store
from torchrelay.config import JobConfig
from torchrelay.control.controller import Controller
from torchrelay.control.endpoint import Endpoint
from torchrelay.control.persistence import LEASE_SECONDS, StatePersister, restore
from torchrelay.control.service import ControlServer
from torchrelay.control.store import ElectionTimeout, SealedStore, StoreError, open_backend
from torchrelay.ledger import Ledger


class Standby:
    """This node's bid to lead the job; :attr:`leading` is set once it leads."""

    def __init__(self, config: JobConfig, node: str, token: str, agent: NodeAgent) -> None:
        self.config = config
        self.node = node
        self.token = token
        self.agent = agent
        self.leading: Leading | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._campaign, name="torchrelay-standby")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def _say(self, message: str) -> None:
        with contextlib.suppress(OSError):
            os.write(2, f"torchrelay [{self.node}]: {message}\n".encode(errors="replace"))

    def _campaign(self) -> None:
        backend = open_backend(self.config.state)
        candidate = f"{self.node}:{os.getpid()}"
        while not self._stop.is_set():
            try:
                leadership = backend.campaign(candidate, LEASE_SECONDS, timeout=LEASE_SECONDS)
            except ElectionTimeout:
                continue  # the leader holds on: look again, unless this node stopped
            except StoreError:
                self._stop.wait(LEASE_SECONDS / 5)
                continue
            persister = StatePersister(SealedStore(backend, self.token), leadership)
            try:
                data = None if self._stop.is_set() else persister.resume()
                if data is None:
                    persister.close()  # the job is over: nothing to lead
                    return
                self.leading = Leading(self, persister, data)
            except (StoreError, OSError) as exc:
                self._say(f"could not take over the job: {exc}")
                persister.close()
            return
        backend.close()

    def close(self) -> dict[str, Any] | None:
        """Stop campaigning; if this node led the job, wait for its end (the node agent got
        ``finish``, so it is near) and return the job's outcome."""
        self._stop.set()
        if self.leading is None:
            return None
        return self.leading.close()


class Leading:
    """The job's controller on a standby that won: store, control RPC, controller."""

    def __init__(self, standby: Standby, persister: StatePersister, data: dict[str, Any]) -> None:
        config = standby.config
        self.persister = persister
        host = address_towards(config.master_addr)
        timeout = datetime.timedelta(seconds=config.collective_timeout)
        self.store = serve_store(bind_rendezvous(host, 0), timeout)
        store = f"{host}:{self.store.port}"
        self.ledger = Ledger(config.run_dir / "ledger.jsonl")
        job = restore(data, config.hang_floor, time.time())
        self.controller = Controller(
            config, self.ledger, standby.agent, persister=persister, job=job
        )
        self.server = ControlServer(self.controller, standby.token, host=host, port=0)
        control = self.server.address
        self.controller.take_over(standby.node, persister.term, control, store)
        self.server.start()
        self.controller.start_monitor()
        _replace(config.run_dir / "token", standby.token)
        _replace(config.run_dir / "endpoint", control)
        try:
            persister.publish(Endpoint(control, store, persister.term))
        except StoreError as exc:
            self.controller.stop(f"the job state could not be recorded ({exc})")
        standby._say(f"took over the job (term {persister.term}): control {control}, store {store}")

    def close(self) -> dict[str, Any] | None:
        outcome = self.controller.wait_finished(timeout=30.0)
        if outcome is not None and outcome["status"] == "succeeded":
            self.controller.wait_all_gone(timeout=30.0)
        self.server.stop()
        self.ledger.close()
        self.persister.close()
        return outcome


def _replace(path: Path, text: str) -> None:
    """Write ``path`` (mode 0600) by renaming a fresh file over it: a link planted there is
    replaced, never followed."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(temporary, path)
