"""``torchrelay run`` on one node: the TCP store, the controller, its RPC server and the agent.

The launcher returns the job's exit status: 0 when every slot finished its steps, 1 when the
controller ended the job (the reason is printed and written to the ledger), 143 / 130 when
SIGTERM / SIGINT stopped it (see :mod:`torchrelay.agent.signals`). A rendezvous endpoint that
cannot be served here, or a run directory that already holds a job, is refused with a one-line
error before anything starts.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import TYPE_CHECKING, Any

from torchrelay.agent.agent import NodeAgent
from torchrelay.agent.console import worker_slot
from torchrelay.agent.rendezvous import RendezvousError, bind_rendezvous, serve_store
from torchrelay.agent.resume import (
    Recorder,
    hold,
    reclaim_run_dir,
    resumed_event,
    set_aside_refused,
)
from torchrelay.agent.rundir import RunDirError, claim_run_dir, create_exclusive
from torchrelay.agent.signals import ALONGSIDE, STOP_SIGNALS, StopSignals
from torchrelay.checkpoints import KEY_ENV, CheckpointError, job_key
from torchrelay.config import JobConfig
from torchrelay.control.controller import Controller
from torchrelay.control.endpoint import Endpoint
from torchrelay.control.metrics import MetricsError
from torchrelay.control.observer import Observation
from torchrelay.control.persistence import take_lead
from torchrelay.control.service import ControlServer
from torchrelay.control.store import StoreError
from torchrelay.control.wire import new_token
from torchrelay.events import Event, JobStart, PoolAttached, read_events
from torchrelay.ledger import Ledger

if TYPE_CHECKING:
    from torchrelay.pool.link import PoolLink


class Launch:
    """One job on this node: owns the store, the controller, the RPC server and the agent."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        # Endpoint and token first: a refused one leaves the run directory untouched.
        listener = bind_rendezvous(config.master_addr, config.master_port)
        self.observation = Observation(config.master_addr, config.metrics_port)
        self.token = job_token(config)
        # With an external state store, lead the job there before anything is decided.
        self.persister = take_lead(
            config.state, self.token, candidate=f"{socket.gethostname()}:{os.getpid()}"
        )
        self._history: list[Event] = []  # --resume: the ledger so far
        try:
            if config.resume is not None:
                ledger, self._lock = reclaim_run_dir(config.run_dir)
                set_aside_refused(config)
                self._history = read_events(ledger, strict=False)
            else:
                ledger = claim_run_dir(config.run_dir)
                self._lock = hold(ledger)  # a --resume of this directory waits for its end
            if config.checkpoint_dir is not None and KEY_ENV not in os.environ:
                # Signs the checkpoints' manifests; the workers inherit it (configure).
                os.environ[KEY_ENV] = job_key(config.run_dir, config.nnodes)
        except BaseException:
            self.observation.stop()
            self._give_up_lead()
            raise
        self.ledger = Ledger(ledger)
        try:
            # The store is the rendezvous for every generation's process group (keys are
            # prefixed by generation), hosted here so it lives exactly as long as the job.
            timeout = datetime.timedelta(seconds=config.collective_timeout)
            self.store = serve_store(listener, timeout)
            self._stop = StopSignals()
            self.agent = NodeAgent(
                config, node=f"node{config.node_rank}", on_exit=self._on_exit, seat=self._seat
            )
            self.controller = Controller(
                config,
                self.ledger,
                self.agent,
                persister=self.persister,
                observe=self.observation.observe,
            )
            self.server = ControlServer(
                self.controller, self.token, host=config.master_addr, port=control_port(config)
            )
        except BaseException:
            # Nothing ran: give the directory back, so that the same command can be retried.
            self.ledger.close()
            if config.resume is None:
                ledger.unlink()
            os.close(self._lock)
            self.observation.stop()
            self._give_up_lead()
            raise
        self.agent.configure(self.store.port, self.server.address, self.token)

    def _publish_endpoint(self) -> None:
        """Let operators' tools (status, chaos) find and authenticate to this job."""
        # Created, never reused: a file planted here (a symlink) is neither followed nor trusted.
        create_exclusive(self.config.run_dir / "token", self.token)
        create_exclusive(self.config.run_dir / "endpoint", self.server.address)

    def _seat(self, process: str) -> int | None:
        member = self.controller.members.get(process)
        return worker_slot(process) if member is None or member.slot is None else member.slot

    def _on_exit(self, process: str, returncode: int) -> None:
        # Killed by SIGTERM/SIGINT: maybe by the stop its launcher is about to get (see
        # signals.ALONGSIDE); then the job ends before this exit is seen, as no failure.
        # Once the job has ended, every exit is part of the stop: nothing to wait for.
        shared = -returncode in STOP_SIGNALS and not self.controller.finished
        if shared and self._stop.follows(ALONGSIDE):
            self.controller.terminate(self._stop.name)
        self.controller.on_exit(process, returncode)

    def run(self, pool: PoolLink | None = None, slots: list[int] | None = None) -> dict[str, Any]:
        """Run the job to its end and return the controller's outcome; with ``pool`` (attached,
        holding ``slots``), its link serves the controller from the start."""
        started = JobStart(
            world_size=self.config.world_size,
            spares=self.config.spares,
            script=self.config.script,
            args=tuple(self.config.script_args),
            chaos=tuple(e.to_dict() for e in self.config.chaos),
            run_dir=str(self.config.run_dir),
        )
        if self.config.resume is None:
            self.ledger.write(started.to_json())
        else:  # the same job goes on: one ledger, one report
            self.ledger.write(resumed_event(self._history, self.config).to_json())
        recorder = self._recorder()
        self.server.start()
        self.controller.start_monitor()
        if pool is not None:
            attached = PoolAttached(
                pool=pool.spec.address,
                slots=tuple(slots or ()),
                priority=pool.spec.priority,
                min_nproc=self.config.min_nproc if self.config.elastic else self.config.world_size,
            )
            self.ledger.write(attached.to_json())
            pool.start(self.controller)
        self.observation.start(self.controller.status)
        self._publish_endpoint()
        if self.persister is not None:
            # Where a standby looks to tell whether a newer leader took over from this one.
            store = f"{self.config.master_addr}:{self.store.port}"
            where = Endpoint(self.server.address, store, self.persister.term)
            try:
                self.persister.publish(where)
            except StoreError as exc:
                self.controller.stop(f"the job state could not be recorded ({exc})")
        try:
            with self._stop as stop:
                node = self.agent.node
                self.agent.watch_health(lambda readings: self.controller.health(node, readings))
                self.agent.start_workers()
                for _ in range(self.config.spares):
                    self.agent.start_spare()
                outcome = None
                while outcome is None and stop.received is None:
                    outcome = self.controller.wait_finished(timeout=0.2)
                    if recorder is not None:
                        recorder.tick(self.controller.job.highest_committed)
                if outcome is None:
                    # From here on, exits are the stop itself: the controller records none
                    # as a failure and starts no recovery.
                    self.controller.terminate(stop.name)
                    outcome = self.controller.outcome
                assert outcome is not None
                if outcome["status"] == "succeeded":
                    self.agent.dismiss_unjoined(self.controller.joined())
                if outcome["status"] != "succeeded" or not self.agent.wait_all(timeout=30.0):
                    self.agent.stop_all()
                else:
                    self.controller.wait_all_gone(timeout=30.0)
                return outcome
        finally:
            self.agent.stop_health()
            self.observation.stop()
            self.server.stop()
            self.ledger.close()
            os.close(self._lock)
            self._give_up_lead()

    def _recorder(self) -> Recorder | None:
        if self.config.checkpoint_dir is None:
            return None
        recorder = Recorder(self.ledger, self.config.checkpoint_dir)
        resume = self.config.resume
        if resume is not None and resume.manifest is not None:
            recorder.step = recorder.saved = resume.manifest.step
        return recorder

    def _give_up_lead(self) -> None:
        if self.persister is not None:
            self.persister.close()


TOKEN_ENV = "TORCHRELAY_JOB_TOKEN"


def control_port(config: JobConfig) -> int:
    """Single node: any free port. Several nodes: the store's port + 1, so every node knows it."""
    return 0 if config.nnodes == 1 else config.master_port + 1


def job_token(config: JobConfig) -> str:
    """A fresh token for a one-node job; several nodes must share one through the environment."""
    if config.nnodes == 1:
        return new_token()
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < 16:
        raise SystemExit(
            f"torchrelay run: a job of several nodes needs a shared secret in ${TOKEN_ENV} "
            "(at least 16 characters, the same on every node), e.g. from your scheduler's job "
            "secret or `python -c 'import secrets; print(secrets.token_hex(32))'`"
        )
    return token


def launch(config: JobConfig) -> dict[str, Any]:
    """Run one job described by ``config``; see :class:`Launch`.

    Exits with a one-line message (``SystemExit``) if the endpoint or the run directory is
    refused.
    """
    pool, slots = None, None
    if config.pool is not None:  # attached before anything starts: a full pool refuses
        from torchrelay.pool.link import PoolLink

        pool = PoolLink(config.pool)
        minimum = config.min_nproc if config.elastic else config.world_size
        slots = pool.attach(config.world_size, minimum, config.elastic)
    try:
        try:
            job = Launch(config)
        except (RendezvousError, RunDirError, MetricsError) as exc:
            raise SystemExit(f"torchrelay run: {exc}") from None
        except StoreError as exc:
            raise SystemExit(f"torchrelay run: --state {config.state}: {exc}") from None
        except CheckpointError as exc:
            raise SystemExit(f"torchrelay run: {exc}") from None
        return job.run(pool, slots)
    finally:
        if pool is not None:
            pool.close()
