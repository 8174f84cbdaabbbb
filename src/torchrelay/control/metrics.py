"""The job's Prometheus metrics, driven by its ledger events, and the endpoint that serves them.

:class:`JobMetrics` maps each typed ledger event the controller records to metric updates
(:meth:`JobMetrics.observe`, called by the executor for every event it writes) and refreshes its
gauges from the controller's status snapshot (:meth:`JobMetrics.refresh`). It keeps its own
:class:`~prometheus_client.CollectorRegistry`, so two jobs in one process never share counters.
:func:`serve_metrics` serves it over HTTP on the rendezvous host, bound before the job starts (a
port in use is a one-line :class:`MetricsError`), until :meth:`MetricsServer.stop`.

Counters start from zero with each controller: a controller that takes over a job counts what
it sees from then on (Prometheus treats the reset as a counter restart).
"""

from __future__ import annotations

import errno
import socket
import statistics
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from torchrelay.events import (
    Event,
    Failure,
    HandoverDone,
    RecoveryDone,
    RecoveryPlanned,
    TrainingDone,
)

RECOVERY_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Seconds: live recoveries take about a second; a wait for a spare or a re-plan, minutes."""

LIVE = "live"
"""The ``path`` label of a recovery rebuilt from live replicas after a failure."""
PROACTIVE = "proactive"
"""The ``path`` label of a planned handover (a drain, a health or straggler migration)."""


class MetricsError(ValueError):
    """The metrics endpoint cannot be served; the message says why, in one line."""


class JobMetrics:
    """Every metric of one job (names in docs/observability.md), in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.steps_committed = Gauge(
            "torchrelay_steps_committed", "Steps committed by every slot", registry=r
        )
        self.step_seconds = Gauge(
            "torchrelay_step_seconds", "Median recent step time of the slots (seconds)", registry=r
        )
        self.failures = Counter(
            "torchrelay_failures", "Slot failures, by class", ["kind"], registry=r
        )
        self.recoveries = Counter(
            "torchrelay_recoveries", "Finished recoveries, by path", ["path"], registry=r
        )
        self.recovery_seconds = Histogram(
            "torchrelay_recovery_seconds",
            "Detection to first step of the new generation, per recovery",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.steps_lost = Counter(
            "torchrelay_steps_lost", "Committed steps lost by recoveries", registry=r
        )
        self.steps_recomputed = Counter(
            "torchrelay_steps_recomputed", "Steps in flight redone after recoveries", registry=r
        )
        self.transfer_bytes = Counter(
            "torchrelay_transfer_bytes", "State bytes received by replacements", registry=r
        )
        self.spares_free = Gauge(
            "torchrelay_spares_free", "Idle spares ready or starting", registry=r
        )
        self.generation = Gauge("torchrelay_generation", "The job's generation", registry=r)
        self.recovering = Gauge(
            "torchrelay_recovering", "1 while a recovery is in progress", registry=r
        )
        # Each path's series exists from the start, at 0, so a rate() over it is defined.
        self.recoveries.labels(path=LIVE)
        self.recoveries.labels(path=PROACTIVE)

    def observe(self, event: Event) -> None:
        """Count what one ledger event says (every other event is ignored)."""
        if isinstance(event, Failure):
            self.failures.labels(kind=event.kind).inc()
        elif isinstance(event, RecoveryPlanned):
            self.generation.set(event.generation)
        elif isinstance(event, RecoveryDone):
            self.recovery_seconds.observe(event.recovery_seconds)
            self._moved(LIVE, event)
        elif isinstance(event, HandoverDone):
            self._moved(PROACTIVE, event)
        elif isinstance(event, TrainingDone):
            self.steps_committed.set(event.steps_committed)

    def _moved(self, path: str, event: RecoveryDone | HandoverDone) -> None:
        """Slots moved to new processes by a recovery or a handover: what it cost."""
        self.recoveries.labels(path=path).inc()
        self.steps_lost.inc(event.lost_steps)
        self.steps_recomputed.inc(event.recomputed_steps)
        self.transfer_bytes.inc(event.bytes_transferred)

    def refresh(self, status: dict[str, Any]) -> None:
        """Set the gauges from a controller status snapshot (``Controller.status()``)."""
        self.steps_committed.set(status["steps_committed"])
        self.generation.set(status["generation"])
        self.spares_free.set(len(status["spares"]))
        self.recovering.set(1 if status["recovering"] else 0)
        steps = [m["step_seconds"] for m in status["slots"] if "step_seconds" in m]
        if steps:
            self.step_seconds.set(statistics.median(steps))


class _Quiet(WSGIRequestHandler):
    """No line on stderr per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    """An HTTP server of one registry's metrics, in a daemon thread until :meth:`stop`."""

    def __init__(self, server: WSGIServer) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="torchrelay-metrics", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve ``registry`` at ``http://HOST:PORT/metrics``; :class:`MetricsError` at once for a
    port out of range or in use, or a host that is not this machine's."""
    where = f"--metrics-port {port} on {host}"
    if not 1 <= port <= 65535:
        raise MetricsError(f"{where}: the port must be in 1..65535")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as exc:
        raise MetricsError(f"{where}: cannot resolve {host!r} ({exc})") from None

    class Server(WSGIServer):
        address_family = family

    try:
        server = make_server(
            host, port, make_wsgi_app(registry), server_class=Server, handler_class=_Quiet
        )
    except OSError as exc:
        raise MetricsError(f"{where}: {_why(exc)}") from None
    return MetricsServer(server)


def _why(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (pick another)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "not an address of this machine (metrics are served on the rendezvous host)"
    if exc.errno == errno.EACCES:
        return "no permission to listen on this port (ports below 1024 need privileges)"
    return f"cannot listen there ({exc.strerror or exc})"
