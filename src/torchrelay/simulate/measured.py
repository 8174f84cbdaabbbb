"""Live-recovery figures measured by a real torchrelay run, read from its ``ledger.jsonl``.

Read through the typed events (:mod:`torchrelay.events`), tolerant by design: a ledger is
written by a process that may crash, so torn lines, lines that are not JSON objects, and
malformed events (a field missing or of the wrong type) are skipped, not fatal; so are events
of a newer version.

* recovery time: median ``recovery_seconds`` over ``recovery_done`` events;
* coverage: ``recovery_done`` events with ``lost_steps == 0`` per ``failure`` event, capped
  at 1;
* overhead: the last ``bench`` event's ``overhead``, else the value given by the caller.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from torchrelay.events import Bench, Failure, RecoveryDone, read_events
from torchrelay.ledger import LedgerError
from torchrelay.simulate.errors import ScenarioError
from torchrelay.simulate.params import LiveRecovery


@dataclass(frozen=True)
class RunMeasurement:
    """What one run measured. ``recovery_s`` is None when no recovery completed."""

    run_dir: Path
    failures: int
    recoveries: int
    lossless_recoveries: int
    recovery_s: float | None
    coverage: float
    overhead: float
    overhead_measured: bool

    def applied_to(self, live: LiveRecovery) -> LiveRecovery:
        """``live`` with the measured figures; a recovery time it lacks stays as configured."""
        recovery_s = live.recovery_s if self.recovery_s is None else self.recovery_s
        return replace(live, recovery_s=recovery_s, coverage=self.coverage, overhead=self.overhead)


def measure_run(run_dir: Path, default_overhead: float) -> RunMeasurement:
    """Measure ``run_dir/ledger.jsonl``; raises ``ScenarioError`` when there is no ledger or
    it records no failure (so coverage cannot be measured)."""
    ledger = run_dir / "ledger.jsonl"
    if not ledger.is_file():
        raise ScenarioError(
            f"--from-run {run_dir}: no ledger.jsonl there; pass a torchrelay run dir"
        )
    try:
        events = read_events(ledger, strict=False)
    except LedgerError as err:
        raise ScenarioError(f"--from-run: {err}") from None
    failures = sum(1 for e in events if isinstance(e, Failure))
    if failures == 0:
        raise ScenarioError(
            f"--from-run {ledger}: no 'failure' events, so coverage cannot be measured; "
            "use a run with failures (e.g. chaos injection) or drop --from-run"
        )
    done = [e for e in events if isinstance(e, RecoveryDone)]
    seconds = [e.recovery_seconds for e in done]
    lossless = sum(1 for e in done if e.lost_steps == 0)
    measured = [e.overhead for e in events if isinstance(e, Bench)]
    return RunMeasurement(
        run_dir=run_dir,
        failures=failures,
        recoveries=len(done),
        lossless_recoveries=lossless,
        recovery_s=statistics.median(seconds) if seconds else None,
        coverage=min(1.0, lossless / failures),
        overhead=measured[-1] if measured else default_overhead,
        overhead_measured=bool(measured),
    )
