"""``torchrelay report RUN_DIR --html OUT``: a self-contained HTML page about one run.

The page has no external resource (inline CSS, figures as PNG ``data:`` URIs, no script) so it
can be mailed or attached to a ticket. Every value it shows passes through :func:`html.escape`:
ledger text (causes, reasons, tracebacks) comes from the job's processes and is untrusted.

Sources: :func:`~torchrelay.report.summary.summarize` for the figures ``report --json`` prints,
the raw ledger for times and tracebacks (:mod:`torchrelay.report.timeline`), and the simulate
package for the cost view (:mod:`torchrelay.report.cost`).
"""

from __future__ import annotations

import html
import itertools
import math
from pathlib import Path
from typing import Any

from torchrelay.ledger import LedgerError, read_ledger
from torchrelay.report import plots
from torchrelay.report.cost import CostView, project
from torchrelay.report.summary import PHASES, summarize
from torchrelay.report.timeline import Timeline, build_timeline, failure_events
from torchrelay.simulate import HOURS_PER_YEAR, ScenarioError, StrategyOutcome

PHASE_NAMES = tuple(f"{a}->{b}" for a, b in itertools.pairwise(PHASES))

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1000px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { margin-top: 1.8em; font-size: 1.2em; }
.sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 1em; min-width: 9em; }
.card .v { font-size: 1.6em; font-weight: 600; } .card .k { color: #666; font-size: 0.85em; }
.good { color: #2e7d32; } .bad { color: #c62828; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: right; }
th { background: #f5f5f5; } td.l, th.l { text-align: left; }
img { max-width: 100%; } figure { margin: 0.5em 0; }
figcaption, .note { color: #555; font-size: 0.9em; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
"""


def _e(value: Any) -> str:
    """``value`` as escaped HTML text (quotes included, so it is safe in attributes too)."""
    return html.escape(str(value), quote=True)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _money(dollars: float) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(dollars) >= scale:
            return f"${dollars / scale:,.2f}{suffix}"
    return f"${dollars:,.0f}"


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def _card(label: str, value: str, css: str = "") -> str:
    value_html = f'<div class="v {css}">{_e(value)}</div>'
    return f'<div class="card">{value_html}<div class="k">{_e(label)}</div></div>'


def _table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A table of already escaped cells; the first ``left`` columns are left-aligned."""

    def cells(tag: str, row: list[str]) -> str:
        return "".join(
            f"<{tag}{' class=l' if i < left else ''}>{c}</{tag}>" for i, c in enumerate(row)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return f"<table><tr>{cells('th', [_e(h) for h in head])}</tr>{body}</table>"


def _figure(uri: str, alt: str, caption: str) -> str:
    return f'<figure><img src="{uri}" alt="{_e(alt)}"><figcaption>{caption}</figcaption></figure>'


def _headline(summary: dict[str, Any], timeline: Timeline) -> str:
    failures = summary["failures"]
    zero = summary["zero_loss_recoveries"]
    share = f"{zero}/{len(failures)}" + (f" ({zero / len(failures):.0%})" if failures else "")
    lost = sum(f["lost_steps"] or 0 for f in failures)
    recomputed = sum(f["recomputed_steps"] or 0 for f in failures)
    moved = sum(f["bytes_transferred"] or 0 for f in failures)
    good = "good" if failures and zero == len(failures) else "bad" if failures else ""
    cards = [
        _card("failures recovered with zero lost progress", share, good),
        _card("committed steps", _number(summary["steps_committed"])),
        _card("wall time", _seconds(summary["wall_seconds"] or timeline.wall_seconds)),
        _card("goodput", _share(timeline.goodput)),
        _card("stalled by failures", _seconds(timeline.stalled_seconds)),
        _card("lost / recomputed steps", f"{lost} / {recomputed}", "bad" if lost else ""),
        _card("bytes moved to replacements", _number(moved)),
    ]
    return (
        f'<div class="cards">{"".join(cards)}</div>'
        '<p class="note"><b>Goodput</b> = useful time / wall time, where wall time runs from '
        "<code>job_start</code> to <code>job_end</code> (to the last event while the job runs) "
        "and useful time is wall time minus the "
        "time training was stalled by a failure: each recovery's <code>stall_seconds</code> "
        "(the failure's onset to the first step after the recovery) and, for a failure not "
        "recovered, its onset to the end of the run; overlapping stalls count once. Start-up "
        "and shut-down are not charged to failures, and recomputed steps are listed, not "
        "subtracted.</p>"
    )


def _progress_section(timeline: Timeline) -> str:
    rows = [[_e(p.source), f"{p.t:.2f}", _number(p.steps)] for p in timeline.points]
    return (
        "<h2>Committed steps over time</h2>"
        + _figure(
            plots.progress_plot(timeline),
            "committed steps over wall-clock time, failures marked",
            "Vertical lines mark each failure's onset (F1, F2... as in the failure table); "
            "shading spans the stall until the first step after its recovery.",
        )
        + '<p class="note">The ledger does not record every committed step, only the count '
        "at the events below. The markers are those records; the dashed line between them is "
        "an interpolation, not a measurement.</p>"
        + "<details><summary>the ledger's progress records</summary>"
        + _table(["event", "seconds since start", "steps committed"], rows)
        + "</details>"
    )


def _breakdown_section(summary: dict[str, Any]) -> str:
    recovered = [(n, f) for n, f in enumerate(summary["failures"]) if f["recovered"]]
    if not recovered:
        return "<h2>Recovery-time breakdown</h2><p>No failure was recovered.</p>"
    uri = plots.recovery_bars(
        [f"F{n + 1}" for n, _ in recovered], [f["phases"] for _, f in recovered], PHASE_NAMES
    )
    rows = [
        [f"F{n + 1}"] + [f"{f['phases'].get(p, 0.0) * 1000:.0f}" for p in PHASE_NAMES]
        for n, f in recovered
    ]
    return (
        "<h2>Recovery-time breakdown</h2>"
        + _figure(
            uri,
            "recovery time per failure, stacked by phase",
            "Each bar is one failure's recovery, split at the timeline points the controller "
            f"records: {_e(', '.join(PHASES))}.",
        )
        + _table(["failure", *(f"{p} (ms)" for p in PHASE_NAMES)], rows)
    )


def _failure_section(summary: dict[str, Any], events: list[dict[str, Any]]) -> str:
    failures = summary["failures"]
    if not failures:
        return "<h2>Failures</h2><p>None.</p>"
    rows, traces = [], []
    for n, (f, event) in enumerate(zip(failures, failure_events(events), strict=True)):
        who = "all" if f["rank"] is None else f["rank"]
        rows.append(
            [_e(f"F{n + 1}"), _e(f["kind"]), _e(f["cause"]), _e(who), _e(f["step"]),
             _e(f["detected_by"]), _e("yes" if f["recovered"] else "no"),
             _e(_seconds(f["recovery_seconds"])), _e(_seconds(f["stall_seconds"])),
             _e(_number(f["lost_steps"])), _e(_number(f["recomputed_steps"])),
             _e(_number(f["bytes_transferred"])), _e(_number(f.get("resumed_at_step")))]
        )  # fmt: skip
        if event.get("traceback"):
            traces.append(
                f"<details><summary>F{n + 1} traceback</summary>"
                f"<pre>{_e(event['traceback'])}</pre></details>"
            )
    head = ["#", "class", "cause", "slot", "step", "detected by", "recovered", "recovery",
            "stall", "lost steps", "recomputed", "bytes", "resumed at"]  # fmt: skip
    return "<h2>Failures</h2>" + _table(head, rows, left=4) + "".join(traces)


def _outcome_cells(outcome: StrategyOutcome) -> list[str]:
    return [
        _e(_share(outcome.ettr)),
        _e(_money(outcome.dollars_per_h * HOURS_PER_YEAR)),
        _e("none" if math.isinf(outcome.interval_h) else f"{outcome.interval_h:.2f} h"),
        _e(_number(outcome.spare_gpus)),
    ]


def _cost_section(run_dir: Path, cost: CostView | str) -> str:
    title = "<h2>Projected cost at scale</h2>"
    if isinstance(cost, str):
        return title + f"<p>Not available: {_e(cost)}</p>"
    m = cost.measurement
    rows = []
    for form in cost.projections:
        saved = form.checkpoint_restart.dollars_per_h - form.live_recovery.dollars_per_h
        for name, outcome in (
            ("checkpoint-restart", form.checkpoint_restart),
            ("live recovery (this run's measurements)", form.live_recovery),
        ):
            rows.append(
                [
                    _e(f"{form.gpus:,}"),
                    _e(f"{form.mttf_h:.2f} h"),
                    _e(name),
                    *_outcome_cells(outcome),
                ]
            )
        rows[-1].append(_e(_money(saved * HOURS_PER_YEAR)))
        rows[-2].append("")
    head = ["GPUs", "job MTTF", "strategy", "ETTR", "$ lost / year", "checkpoint every",
            "spare GPUs", "saved / year"]  # fmt: skip
    recovery = "not measured" if m.recovery_s is None else f"{m.recovery_s:.2f} s"
    overhead = f"{m.overhead:.1%}" + (" (measured)" if m.overhead_measured else " (default)")
    return (
        title + f"<p>What <code>torchrelay simulate --from-run {_e(run_dir)} --gpus N</code> "
        "projects for this job's measured recovery: median recovery "
        f"{_e(recovery)}, coverage {_e(_share(m.coverage))} ({m.lossless_recoveries} of "
        f"{m.failures} failures recovered with zero lost steps), overhead {_e(overhead)}. "
        "The rest is the simulator's default scenario (published MTTF calibration, "
        "Young/Daly checkpoint interval, "
        f"${cost.price_per_gpu_h:,.2f} per GPU-hour). ETTR (effective training time ratio): "
        "the share of wall-clock time that ends up as kept progress, exact closed form.</p>"
        + _table(head, rows, left=3)
    )


def _end_section(events: list[dict[str, Any]]) -> str:
    end = next((e for e in reversed(events) if e["event"] == "job_end"), None)
    if end is None or not end.get("traceback"):
        return ""
    return f"<h2>How the job ended</h2><pre>{_e(end['traceback'])}</pre>"


def render(run_dir: Path) -> str:
    """The page for ``run_dir``'s ledger.

    Raises what :func:`summarize` and :func:`read_ledger` raise for a missing or malformed
    ledger (``FileNotFoundError``, ``LedgerError``; an empty one too).
    The cost view needs a run with a failure; without one the page says why it is missing.
    """
    summary = summarize(run_dir)
    events = read_ledger(run_dir / "ledger.jsonl")
    if not events:
        raise LedgerError(f"{run_dir / 'ledger.jsonl'} has no events yet: nothing to report")
    timeline = build_timeline(events, summary)
    try:
        cost: CostView | str = project(run_dir)
    except ScenarioError as err:
        cost = str(err)
    status = summary["status"] + (f" by {summary['signal']}" if summary.get("signal") else "")
    reason = f" — {summary['reason']}" if summary.get("reason") else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>torchrelay report: {_e(run_dir)}</title><style>{_CSS}</style></head><body>"
        f"<h1>torchrelay run report</h1><p class=sub>{_e(run_dir)}: <b>{_e(status)}</b>"
        f"{_e(reason)} · world size {_e(_number(summary['world_size']))}</p>"
        + _headline(summary, timeline)
        + _progress_section(timeline)
        + _breakdown_section(summary)
        + _failure_section(summary, events)
        + _cost_section(run_dir, cost)
        + _end_section(events)
        + "</body></html>\n"
    )


def write_report(run_dir: Path, out: Path) -> None:
    """Write :func:`render`'s page to ``out`` (``OSError`` if it cannot be written)."""
    out.write_text(render(run_dir), encoding="utf-8")
