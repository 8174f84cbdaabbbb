"""The job's Prometheus metrics: each ledger event's effect on them (no processes), the executor
feeding them every event it records, and the endpoint that serves them (a real socket)."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from tests.test_protocol import EVENTS as EVENT_SAMPLES
from torchrelay.control.actions import EndJob, Record
from torchrelay.control.executor import Executor
from torchrelay.control.metrics import JobMetrics, MetricsError, serve_metrics
from torchrelay.control.rejections import Rejections
from torchrelay.events import (
    Event,
    Failure,
    HandoverDone,
    JobEnd,
    RecoveryDone,
    RecoveryPlanned,
    SpareReady,
    TrainingDone,
)
from torchrelay.ledger import Ledger, read_ledger


def failure(kind: str, slot: int = 1) -> Failure:
    return Failure(
        slot=slot,
        process=f"worker{slot}",
        last_reported_step=3,
        cause="SIGKILL",
        kind=kind,
        detected_by="process exit (waitpid)",
    )


def done(seconds: float, lost: int = 0, recomputed: int = 1, nbytes: int = 1000) -> RecoveryDone:
    return RecoveryDone(
        generation=1,
        slots=(1,),
        failures=({"slot": 1},),
        target_step=3,
        timeline={"detected": 0.0, "first_step": seconds},
        recovery_seconds=seconds,
        stall_seconds=seconds,
        bytes_transferred=nbytes,
        lost_steps=lost,
        recomputed_steps=recomputed,
    )


def value(metrics: JobMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_events_drive_the_counters_and_the_histogram():
    metrics = JobMetrics()
    assert value(metrics, "torchrelay_recoveries_total", path="live") == 0.0  # defined at once
    for event in (
        failure("signal"),
        failure("signal", slot=2),
        failure("stall"),
        done(0.8, recomputed=1, nbytes=1000),
        done(3.0, lost=2, recomputed=0, nbytes=500),
        SpareReady(process="spare0"),  # not a metric: ignored
    ):
        metrics.observe(event)
    assert value(metrics, "torchrelay_failures_total", kind="signal") == 2
    assert value(metrics, "torchrelay_failures_total", kind="stall") == 1
    assert value(metrics, "torchrelay_recoveries_total", path="live") == 2
    assert value(metrics, "torchrelay_recovery_seconds_count") == 2
    assert value(metrics, "torchrelay_recovery_seconds_sum") == pytest.approx(3.8)
    assert value(metrics, "torchrelay_recovery_seconds_bucket", le="1.0") == 1
    assert value(metrics, "torchrelay_recovery_seconds_bucket", le="5.0") == 2
    assert value(metrics, "torchrelay_steps_lost_total") == 2
    assert value(metrics, "torchrelay_steps_recomputed_total") == 1
    assert value(metrics, "torchrelay_transfer_bytes_total") == 1500


def test_gauges_follow_the_events_and_the_status_snapshot():
    metrics = JobMetrics()
    metrics.observe(
        RecoveryPlanned(
            generation=3, target_step=9, sources=(0,), receivers=(1,), replaced={}, lost_steps=0
        )
    )
    assert value(metrics, "torchrelay_generation") == 3
    metrics.observe(TrainingDone(steps_committed=40))
    assert value(metrics, "torchrelay_steps_committed") == 40
    slot = {"state": "active", "slot": 0}
    status = {
        "steps_committed": 41,
        "generation": 4,
        "recovering": True,
        "spares": [{"state": "ready"}, {"state": "starting"}],
        "slots": [{**slot, "step_seconds": 0.3}, {**slot, "step_seconds": 0.1}, slot],
    }
    metrics.refresh(status)
    assert value(metrics, "torchrelay_steps_committed") == 41
    assert value(metrics, "torchrelay_generation") == 4
    assert value(metrics, "torchrelay_spares_free") == 2
    assert value(metrics, "torchrelay_recovering") == 1
    assert value(metrics, "torchrelay_step_seconds") == pytest.approx(0.2)


def test_two_jobs_in_one_process_count_apart():
    first, second = JobMetrics(), JobMetrics()
    first.observe(failure("signal"))
    assert value(first, "torchrelay_failures_total", kind="signal") == 1
    assert value(second, "torchrelay_failures_total", kind="signal") is None


class _Agent:
    def start_spare(self) -> None:
        pass

    def kill(self, process: str, signum: int = 9, stacks: bool = False) -> None:
        pass


def test_the_executor_shows_every_event_it_records_after_writing_it(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    seen: list[tuple[Event, int]] = []

    def observe(event: Event) -> None:
        # Written first: a scrape never counts what the ledger does not hold.
        seen.append((event, len(read_ledger(tmp_path / "ledger.jsonl"))))

    executor = Executor(ledger, _Agent(), Rejections(ledger), lambda: None, observe)
    executor.apply([Record(failure("signal")), EndJob({"status": "failed", "steps_committed": 2})])
    ledger.close()
    assert [(type(e), n) for e, n in seen] == [(Failure, 1), (JobEnd, 2)]


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        return answer.read().decode()


def test_the_endpoint_serves_the_registry_until_stopped():
    metrics = JobMetrics()
    metrics.observe(failure("exception"))
    server = serve_metrics(metrics.registry, "127.0.0.1", _free_port())
    try:
        assert 'torchrelay_failures_total{kind="exception"} 1.0' in scrape(server.address)
    finally:
        server.stop()
    with pytest.raises(OSError):
        scrape(server.address)


def test_a_port_in_use_or_out_of_range_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsError, match="the port is in use"):
            serve_metrics(JobMetrics().registry, "127.0.0.1", port)
    with pytest.raises(MetricsError, match=r"must be in 1\.\.65535"):
        serve_metrics(JobMetrics().registry, "127.0.0.1", 70000)
    with pytest.raises(MetricsError, match="cannot resolve"):
        serve_metrics(JobMetrics().registry, "no-such-host.invalid", 9100)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_handover_counts_as_a_proactive_move():
    metrics = JobMetrics()
    (done,) = [e for e in EVENT_SAMPLES if isinstance(e, HandoverDone)]
    metrics.observe(done)
    value = metrics.registry.get_sample_value
    assert value("torchrelay_recoveries_total", {"path": "proactive"}) == 1.0
    assert value("torchrelay_recoveries_total", {"path": "live"}) == 0.0
    assert value("torchrelay_transfer_bytes_total") == done.bytes_transferred
