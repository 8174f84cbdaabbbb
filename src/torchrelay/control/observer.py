"""The launcher's look at its own controller: metrics gauges and progress of long waits.

:class:`JobObserver` reads the controller's status snapshot (the one the status RPC serves)
every ``interval`` seconds in a daemon thread, until the job ends: it refreshes the metrics'
gauges and prints a line while a recovery waits for a spare (:class:`SpareWait`). What it
decides from a snapshot is pure (tested without threads); it never changes the job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torchrelay.control.metrics import JobMetrics, MetricsServer, serve_metrics
from torchrelay.control.state import RecoveryStep
from torchrelay.events import Event
from torchrelay.progress import Emit, to_stderr


class SpareWait:
    """``waiting for a spare (N s)`` lines while a recovery waits for spares: the first once it
    waited ``quiet_for`` seconds, then one every ``every`` seconds, per recovery round."""

    def __init__(self, emit: Emit = to_stderr, quiet_for: float = 1.0, every: float = 5.0):
        self._emit = emit
        self._quiet_for, self._every = quiet_for, every
        self._said: tuple[float, float] | None = None  # (round's detection time, waited then)

    def update(self, recovery: dict[str, Any] | None) -> None:
        """Look at a status snapshot's ``recovery`` (see ``control.job_view``)."""
        if recovery is None or recovery["step"] != RecoveryStep.SPARES.value:
            return
        waited = recovery["seconds_in_step"]
        if waited < self._quiet_for:
            return
        said = self._said
        if said is not None and said[0] == recovery["detected"] and waited < said[1] + self._every:
            return
        self._said = (recovery["detected"], waited)
        slots = ", ".join(map(str, recovery["slots"])) or "none"
        self._emit(
            f"torchrelay: recovery of slot(s) {slots} is waiting for a spare ({waited:.0f} s; "
            f"gives up after {recovery['step_limit']:.0f} s, see --spare-timeout)"
        )


class JobObserver:
    """Polls ``status()`` until it shows an outcome or :meth:`stop` is called."""

    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        metrics: JobMetrics | None = None,
        emit: Emit = to_stderr,
        interval: float = 0.5,
    ) -> None:
        self._status = status
        self._metrics = metrics
        self._spare_wait = SpareWait(emit)
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self.run, name="torchrelay-observer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def observe(self, status: dict[str, Any]) -> None:
        """Act on one snapshot."""
        if self._metrics is not None:
            self._metrics.refresh(status)
        self._spare_wait.update(status["recovery"])

    def run(self) -> None:
        """Observe every ``interval`` until a snapshot shows the outcome (:meth:`start` runs
        this in a thread)."""
        while not self._stopped.wait(self._interval):
            status = self._status()
            self.observe(status)
            if status["outcome"] is not None:
                return


class Observation:
    """What the launcher's ``--metrics-port`` and progress lines need, made before the job
    starts: the metrics and their endpoint (bound here, so a bad port is refused with one line,
    :class:`~torchrelay.control.metrics.MetricsError`, before anything runs), then the observer
    (:meth:`start`), until :meth:`stop`."""

    def __init__(self, host: str, metrics_port: int) -> None:
        self.metrics = JobMetrics() if metrics_port else None
        self.server: MetricsServer | None = None
        if self.metrics is not None:
            self.server = serve_metrics(self.metrics.registry, host, metrics_port)
        self._observer: JobObserver | None = None

    @property
    def observe(self) -> Callable[[Event], None] | None:
        """What the controller's executor calls with every event it records."""
        return None if self.metrics is None else self.metrics.observe

    def start(self, status: Callable[[], dict[str, Any]]) -> None:
        self._observer = JobObserver(status, self.metrics)
        self._observer.start()

    def stop(self) -> None:
        """Stop observing and serving; the endpoint's last answer had the final counts."""
        if self._observer is not None:
            self._observer.stop()
        if self.server is not None:
            self.server.stop()
