"""``benchmarks.md``: one table per metric, the targets, and how the numbers were made.

Numbers are medians over jobs (or over failures) with min-max in brackets; ratios are taken
within a repeat (same minute, same machine load) and then summarised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bench import metrics
from bench.metrics import Spread
from bench.runner import BenchResults, JobResult, weight_diff
from bench.systems import SYSTEMS
from bench.workload import model_size

NAMES = {
    "ddp": "plain DDP",
    "torchrun_ckpt": "torchrun + ckpt",
    "torchft": "torchft",
    "torchrelay": "torchrelay + spare",
}


@dataclass(frozen=True)
class Target:
    """A target from the issue and whether this run met it."""

    name: str
    measured: str
    met: bool | None  # None: not measurable in this run


def fmt(s: Spread, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    """``median (min-max)`` or ``n/a``."""
    if s.n == 0:
        return "n/a"
    med, lo, hi = (f"{v * scale:.{digits}f}" for v in (s.median, s.lo, s.hi))
    return f"{med}{unit}" if s.n == 1 or lo == hi else f"{med}{unit} ({lo}-{hi})"


def _ok(jobs: Iterable[JobResult]) -> list[JobResult]:
    return [j for j in jobs if j.error is None]


def _per_repeat_ratio(
    results: BenchResults,
    model: str,
    system: str,
    failures: bool,
    value: Callable[[JobResult], float],
    base: Callable[[JobResult], float],
    base_system: str,
    base_failures: bool,
) -> Spread:
    """value(job) / base(job of ``base_system`` in the same repeat)."""
    bases = {j.repeat: j for j in _ok(results.find(base_system, model, base_failures))}
    return metrics.spread(
        value(j) / base(bases[j.repeat])
        for j in _ok(results.find(system, model, failures))
        if j.repeat in bases
    )


def _impacts(results: BenchResults, system: str, model: str) -> list[metrics.FailureImpact]:
    return [i for j in _ok(results.find(system, model, True)) for i in j.impacts]


def throughput_table(results: BenchResults, model: str) -> list[str]:
    rows = ["| system | steps/s, no failure | ratio to plain DDP (same repeat) |", "|---|---|---|"]
    for system in SYSTEMS:
        rate = metrics.spread(j.steady_steps_per_s for j in _ok(results.find(system, model, False)))
        ratio = _per_repeat_ratio(
            results,
            model,
            system,
            False,
            lambda j: j.steady_steps_per_s,
            lambda j: j.steady_steps_per_s,
            "ddp",
            False,
        )
        rows.append(f"| {NAMES[system]} | {fmt(rate, 1)} | {fmt(ratio, 3)} |")
    return rows


def failure_table(results: BenchResults, model: str) -> list[str]:
    rows = [
        "| system | stall s (kill → normal pace) | resume s (kill → first new step) | "
        "degraded s (→ full world) | committed steps lost | steps recomputed | "
        "samples dropped | time lost s (25 steps after the job is whole) | failures measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for system in SYSTEMS[1:]:
        imp = _impacts(results, system, model)
        cells = [
            fmt(metrics.spread(i.stall_s for i in imp), 3),
            fmt(metrics.spread(i.resume_s for i in imp), 3),
            fmt(metrics.spread(i.degraded_s for i in imp), 3),
            fmt(metrics.spread(i.lost_steps for i in imp), 0),
            fmt(metrics.spread(i.recomputed_steps for i in imp), 0),
            fmt(metrics.spread(i.samples_dropped for i in imp), 0),
            fmt(metrics.spread(i.time_lost_s for i in imp), 3),
        ]
        rows.append(f"| {NAMES[system]} | {' | '.join(cells)} | {len(imp)} |")
    return rows


def _own_pace_ratio(job: JobResult) -> float:
    """A failure job's time over what it would have taken at its own pace: its wall time less
    the time each of its failures lost (``metrics`` module doc), so the pace of another job,
    which drifts by more than a few percent from job to job here, does not enter it."""
    lost = sum(i.time_lost_s for i in job.impacts)
    return job.wall_s / (job.wall_s - lost) if job.impacts else math.nan


def e2e_table(results: BenchResults, model: str, failures: int) -> list[str]:
    rows = [
        f"| system | no failure s | {failures} failure(s) s | ratio (same repeat) | "
        "ratio to its own pace (wall / (wall - time lost)) |",
        "|---|---|---|---|---|",
    ]
    for system in SYSTEMS[1:]:
        ok = metrics.spread(j.wall_s for j in _ok(results.find(system, model, False)))
        failed = _ok(results.find(system, model, True))
        bad = metrics.spread(j.wall_s for j in failed)
        ratio = _per_repeat_ratio(
            results, model, system, True, lambda j: j.wall_s, lambda j: j.wall_s, system, False
        )
        own = metrics.spread(_own_pace_ratio(j) for j in failed)
        cells = f"{fmt(ok, 1)} | {fmt(bad, 1)} | {fmt(ratio, 3)} | {fmt(own, 3)}"
        rows.append(f"| {NAMES[system]} | {cells} |")
    ddp = metrics.spread(j.wall_s for j in _ok(results.find("ddp", model, False)))
    rows.append(f"| {NAMES['ddp']} | {fmt(ddp, 1)} | (a failure ends the job) | | |")
    return rows


def _weight_rows(results: BenchResults, model: str) -> dict[str, tuple[int, int, Spread]]:
    """system -> (bitwise equal jobs, compared jobs, max abs diff) vs own failure-free run."""
    out = {}
    for system in SYSTEMS[1:]:
        refs = {j.repeat: j for j in _ok(results.find(system, model, False))}
        diffs = [weight_diff(j, refs.get(j.repeat)) for j in _ok(results.find(system, model, True))]
        diffs = [d for d in diffs if d is not None]
        out[system] = (sum(d[0] for d in diffs), len(diffs), metrics.spread(d[1] for d in diffs))
    return out


def weights_table(results: BenchResults, model: str) -> list[str]:
    rows = [
        "| system | bitwise equal to its failure-free run | max abs difference | "
        "failure-free run equal to plain DDP's |",
        "|---|---|---|---|",
    ]
    ddp = {j.repeat: j for j in _ok(results.find("ddp", model, False))}
    for system, (equal, n, diff) in _weight_rows(results, model).items():
        same = [weight_diff(j, ddp.get(j.repeat)) for j in _ok(results.find(system, model, False))]
        same = [d for d in same if d is not None]
        vs_ddp = f"{sum(d[0] for d in same)}/{len(same)} bitwise" if same else "n/a"
        rows.append(f"| {NAMES[system]} | {equal}/{n} | {fmt(diff, 3, unit='')} | {vs_ddp} |")
    return rows


def _phases(results: BenchResults, model: str) -> list[metrics.RecoveryPhases]:
    return [p for j in _ok(results.find("torchrelay", model, True)) for p in j.phases]


def recovery_table(results: BenchResults, model: str) -> list[str]:
    phases = _phases(results, model)
    bw = results.broadcast_bps.get(model, math.nan)
    ms = 1000.0

    def col(get: Callable[[metrics.RecoveryPhases], float]) -> str:
        return fmt(metrics.spread(get(p) for p in phases), 1, ms)

    eff = metrics.spread(p.transfer_bytes_per_s / bw for p in phases)
    rate = metrics.spread(p.transfer_bytes_per_s for p in phases)
    moved = metrics.spread(p.bytes_moved for p in phases)
    return [
        "| detect ms | plan ms | communicator ms | transfer ms | first step ms | "
        "kill → first step ms | MB moved | transfer MB/s | gloo broadcast MB/s "
        "(probe) | transfer efficiency |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {col(lambda p: p.detect)} | {col(lambda p: p.plan)} | "
        f"{col(lambda p: p.communicator)} | {col(lambda p: p.transfer)} | "
        f"{col(lambda p: p.first_step)} | {col(lambda p: p.total)} | "
        f"{fmt(moved, 1, 1e-6)} | {fmt(rate, 0, 1e-6)} | {bw / 1e6:.0f} | "
        f"{fmt(eff, 2)} |",
        f"\n{len(phases)} recoveries.",
    ]


def targets(results: BenchResults) -> list[Target]:
    """The issue's targets, evaluated on the first (demo-sized) model; transfer on all."""
    model = results.config.scenarios[0].model
    out = []
    ratio = _per_repeat_ratio(
        results,
        model,
        "torchrelay",
        False,
        lambda j: j.steady_steps_per_s,
        lambda j: j.steady_steps_per_s,
        "ddp",
        False,
    )
    out.append(
        Target(
            "steady state >= 0.98x plain DDP",
            fmt(ratio, 3),
            None if ratio.n == 0 else ratio.median >= 0.98,
        )
    )
    relay = metrics.spread(i.stall_s for i in _impacts(results, "torchrelay", model))
    for peer, factor in (("torchft", 5), ("torchrun_ckpt", 10)):
        stall = metrics.spread(i.stall_s for i in _impacts(results, peer, model))
        x = stall.median / relay.median if relay.n and stall.n and relay.median > 0 else math.nan
        out.append(
            Target(
                f"stall >= {factor}x shorter than {NAMES[peer]}",
                f"{x:.1f}x ({stall.median:.3f} s vs {relay.median:.3f} s)",
                None if math.isnan(x) else x >= factor,
            )
        )
    imp = _impacts(results, "torchrelay", model)
    lost = max((i.lost_steps for i in imp), default=0)
    out.append(
        Target(
            "0 committed steps lost",
            f"max {lost}",
            None if not imp else all(i.lost_steps == 0 for i in imp),
        )
    )
    out.append(
        Target(
            "<= 1 step recomputed per failure",
            f"max {max((i.recomputed_steps for i in imp), default=0)}",
            None if not imp else all(i.recomputed_steps <= 1 for i in imp),
        )
    )
    own = metrics.spread(_own_pace_ratio(j) for j in _ok(results.find("torchrelay", model, True)))
    out.append(
        Target(
            "end-to-end with failures <= 1.03x the job's own pace",
            fmt(own, 3),
            None if own.n == 0 else own.median <= 1.03,
        )
    )
    for scenario in results.config.scenarios:
        equal, n, _ = _weight_rows(results, scenario.model)["torchrelay"]
        out.append(
            Target(
                f"weights bitwise equal ({scenario.model})",
                f"{equal}/{n}",
                None if n == 0 else equal == n,
            )
        )
        bw = results.broadcast_bps.get(scenario.model, math.nan)
        eff = metrics.spread(p.transfer_bytes_per_s / bw for p in _phases(results, scenario.model))
        out.append(
            Target(
                f"transfer efficiency >= 0.5 ({scenario.model})",
                fmt(eff, 2),
                None if eff.n == 0 else eff.median >= 0.5,
            )
        )
    return out


def errors(results: BenchResults) -> list[str]:
    return [
        f"- {j.system} {j.model} repeat {j.repeat} failures={j.failures}: {j.error}"
        for j in results.jobs
        if j.error
    ] + [
        f"- note: {j.system} {j.model} repeat {j.repeat}: {n}"
        for j in results.jobs
        for n in j.notes
        if "restarted" not in n
    ]


def render(
    results: BenchResults, command: str, machine: dict[str, str], elapsed_s: float, analysis: str
) -> str:
    """The whole markdown document."""
    cfg = results.config
    lines = [
        "# Benchmarks: plain DDP vs torchrun + checkpoint vs torchft vs torchrelay",
        "",
        "Generated by `bench/` — do not edit the numbers by hand; rerun instead.",
        "",
        f"- command: `{command}` (preset `{cfg.name}`, {elapsed_s / 60:.1f} min)",
        *(f"- {k}: {v}" for k, v in machine.items()),
        f"- world size {cfg.world} workers (gloo, loopback, `OMP_NUM_THREADS=1`), AdamW, "
        "MLP, synthetic batches that are a pure function of (step, rank); rank "
        f"{cfg.kill_rank} SIGKILLs itself at the start of each scheduled step",
        f"- torchrun: checkpoint every {cfg.ckpt_every} steps, `--max-restarts`; torchft: "
        f"lighthouse `--min_replicas 1 --heartbeat_timeout_ms {cfg.heartbeat_ms}` "
        "(default 5000), killed replica group restarted by the bench; torchrelay: "
        "`--spares 1`",
    ]
    for s in cfg.scenarios:
        shape = model_size(s.model)
        lines.append(
            f"- **{s.model}** model: {shape.params / 1e6:.2f} M parameters "
            f"({shape.state_bytes / 1e6:.0f} MB weights + AdamW state), batch "
            f"{shape.batch}/rank, {s.steps} steps, kills at steps "
            f"{', '.join(map(str, s.kill_steps))}, {s.repeats} repeat(s)"
        )
    lines += [
        "",
        "Cells: median (min-max) over jobs, or over failures for per-failure metrics.",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for t in targets(results):
        met = "n/a" if t.met is None else ("yes" if t.met else "**no**")
        lines.append(f"| {t.name} | {t.measured} | {met} |")
    for s in cfg.scenarios:
        m = s.model
        lines += [
            "",
            f"## {m} model",
            "",
            "### Throughput without failures",
            "",
            *throughput_table(results, m),
            "",
            f"### One SIGKILL (each of the {len(s.kill_steps)} kills of the failure "
            "jobs, measured separately)",
            "",
            *failure_table(results, m),
            "",
            f"### End-to-end time of the {s.steps}-step job (launch to exit)",
            "",
            *e2e_table(results, m, len(s.kill_steps)),
            "",
            "### Final weights",
            "",
            *weights_table(results, m),
            "",
            "### torchrelay recovery breakdown (ledger)",
            "",
            *recovery_table(results, m),
        ]
    lines += ["", "![progress](img/bench_progress.png)", "", analysis.strip(), ""]
    problems = errors(results)
    if problems:
        lines += ["", "## Jobs that failed or deviated", "", *problems, ""]
    return "\n".join(lines)
