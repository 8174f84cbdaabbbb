"""Runs every (scenario, repeat, system, failure schedule) job and measures it.

Jobs are interleaved by repeat (all systems of repeat 1, then of repeat 2, ...) so that load
from other processes on the machine spreads over the systems instead of hitting one of them.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench import metrics
from bench.config import BenchConfig, Scenario
from bench.probe import measure_broadcast
from bench.systems import RunSpec, System
from bench.workload import model_size


@dataclass
class JobResult:
    """One job's measurements (``error`` set if it did not finish)."""

    system: str
    model: str
    repeat: int
    failures: int
    wall_s: float = math.nan
    steady_steps_per_s: float = math.nan
    impacts: list[metrics.FailureImpact] = field(default_factory=list)
    phases: list[metrics.RecoveryPhases] = field(default_factory=list)
    commits: list[metrics.Commit] = field(default_factory=list)
    kill_times: list[float] = field(default_factory=list)
    kill_steps: list[int] = field(default_factory=list)
    start_t: float = math.nan
    weights: Path | None = None
    refill_cpu_s: list[float] = field(default_factory=list)  # torchrelay's refill spares
    after_stall: list[list[float]] = field(default_factory=list)  # per kill, metrics.after_stall
    error: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class BenchResults:
    """All jobs plus the per-model broadcast bandwidth probe (bytes/s)."""

    config: BenchConfig
    jobs: list[JobResult] = field(default_factory=list)
    broadcast_bps: dict[str, float] = field(default_factory=dict)

    def find(self, system: str, model: str, failures: bool) -> list[JobResult]:
        return [
            j
            for j in self.jobs
            if j.system == system and j.model == model and (j.failures > 0) == failures
        ]


def kills_in(workdir: Path) -> list[metrics.Kill]:
    """The kills a job's ``KillSwitch`` markers in ``workdir`` recorded, in time order."""
    kills = [metrics.parse_kill_marker(p.read_text()) for p in workdir.glob("kill*")]
    return sorted(kills, key=lambda k: k.t)


def ledger_events(ledger: Path | None) -> list[dict[str, Any]]:
    """A torchrelay ledger's events ([] if there is none)."""
    if ledger is None or not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]


def template_log(ledger: Path | None) -> str:
    """The node template's log beside a torchrelay ledger ('' if there is none)."""
    log = None if ledger is None else ledger.parent / "logs" / "template.log"
    return log.read_text() if log is not None and log.exists() else ""


def run_job(
    system: System,
    scenario: Scenario,
    config: BenchConfig,
    repeat: int,
    failures: bool,
    workdir: Path,
) -> JobResult:
    """Runs one job and turns its files into a :class:`JobResult` (never raises)."""
    workdir.mkdir(parents=True, exist_ok=True)
    kills = scenario.kill_steps if failures else ()
    result = JobResult(system.name, scenario.model, repeat, len(kills))
    spec = RunSpec(
        scenario.model,
        scenario.steps,
        config.world,
        kills,
        config.kill_rank,
        workdir,
        config.run_timeout_s,
    )
    try:
        out = system.run(spec)
        result.wall_s, result.notes = out.wall_s, out.notes
        if out.returncode != 0:
            raise RuntimeError(f"exit code {out.returncode}; logs in {workdir}")
        commits = metrics.parse_progress(spec.progress_file.read_text())
        result.commits = commits
        result.start_t = commits[0].t if commits else math.nan
        kill_list = kills_in(workdir)
        result.kill_times = [k.t for k in kill_list]
        result.kill_steps = [k.step for k in kill_list]
        first_kill = min(result.kill_times, default=math.inf)
        result.steady_steps_per_s = metrics.steady_rate([c for c in commits if c.t < first_kill])
        batch = model_size(scenario.model).batch
        result.impacts = metrics.all_failures(commits, kill_list, config.world, batch)
        result.after_stall = metrics.all_after_stall(commits, kill_list, result.impacts)
        events = ledger_events(out.ledger)
        recoveries = [e for e in events if e.get("event") == "recovery_done"]
        result.phases = [
            metrics.recovery_phases(e, k)
            for e, k in zip(recoveries, result.kill_times, strict=False)
        ]
        refills = metrics.refill_cpu(events, template_log(out.ledger))
        result.refill_cpu_s = [cpu for cpu, _ in refills]
        if spec.weights_file.exists():
            result.weights = spec.weights_file
        if len(result.kill_times) != len(kills):
            result.notes.append(f"{len(result.kill_times)} of {len(kills)} kills fired")
    except Exception as exc:  # one broken job must not lose the others' results
        result.error = f"{type(exc).__name__}: {exc}"
        (workdir / "bench_error.txt").write_text(traceback.format_exc())
    return result


def weight_diff(job: JobResult, reference: JobResult | None) -> tuple[bool, float] | None:
    """(bitwise equal, max abs diff) of a job's final weights against ``reference``'s."""
    if job.weights is None or reference is None or reference.weights is None:
        return None
    return metrics.compare_weights(torch.load(job.weights), torch.load(reference.weights))


def run_all(
    config: BenchConfig,
    systems: list[System],
    workdir: Path,
    on_job: Callable[[str], None],
    on_done: Callable[[JobResult], None],
) -> BenchResults:
    """Runs every job of ``config``; ``on_job``/``on_done`` report progress."""
    results = BenchResults(config)
    for scenario in config.scenarios:
        state = model_size(scenario.model).state_bytes
        on_job(f"{scenario.model}: gloo broadcast probe ({state / 1e6:.0f} MB)")
        results.broadcast_bps[scenario.model] = measure_broadcast(state)
        for repeat in range(scenario.repeats):
            for system in systems:
                for failures in (False, True):
                    if failures and not system.tolerates_failures:
                        continue
                    tag = f"{scenario.model}-r{repeat}-{system.name}-{'fail' if failures else 'ok'}"
                    on_job(tag)
                    job = run_job(system, scenario, config, repeat, failures, workdir / tag)
                    results.jobs.append(job)
                    on_done(job)
    return results
