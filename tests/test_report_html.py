"""`torchrelay report RUN_DIR --html OUT` on a ledger written here: the derived timeline and
goodput, escaping of untrusted ledger text, and one-line errors for bad paths. The same page
for a real job with two kills, opened in headless Chromium, is in test_report_html_render.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.jobs import cli
from torchrelay.ledger import Ledger, read_ledger
from torchrelay.report.html import render
from torchrelay.report.summary import summarize
from torchrelay.report.timeline import build_timeline

T0 = 1_000.0
HOSTILE_TRACE = 'Traceback:\n  <script>alert("trace")</script>'
HOSTILE_REASON = "<img src=x onerror=alert(1)>"


def _failure(slot: int, t: float, **extra) -> dict:
    return {
        "slot": slot,
        "process": f"worker{slot}",
        "last_reported_step": 4,
        "cause": "RuntimeError: <b>boom</b>",
        "kind": "exception",
        "detected_by": "process exit (waitpid)",
        "generation": 0,
        "t": t,
        "onset": t,
        "step": 5,
        **extra,
    }


def write_ledger(run_dir: Path) -> Path:
    """A 100 s job of 2 ranks: rank 1 fails at +10 s and is recovered by +15 s (5 steps
    committed, 1 recomputed); rank 0 fails at +90 s and is not; the job ends at +100 s."""
    ledger = Ledger(run_dir / "ledger.jsonl")
    ledger.record("job_start", t=T0, world_size=2, spares=1)
    for slot, t in ((0, T0 + 2), (1, T0 + 3)):
        joined = {"process": f"worker{slot}", "role": "worker", "slot": slot, "pid": 100 + slot}
        ledger.record("process_join", t=t, **joined, node="node0")
    first = _failure(1, T0 + 10, traceback=HOSTILE_TRACE)
    ledger.record("failure", **first)
    timeline = {"detected": T0 + 10, "spare_ready": T0 + 12, "halted": T0 + 12.5}
    timeline |= {"planned": T0 + 13, "comm_ready": T0 + 13.5, "transfer_done": T0 + 14}
    ledger.record(
        "recovery_done",
        t=T0 + 15,
        generation=1,
        slots=[1],
        failures=[first],
        target_step=4,
        timeline={**timeline, "first_step": T0 + 15},
        recovery_seconds=5.0,
        stall_seconds=5.0,
        bytes_transferred=123_456,
        lost_steps=0,
        recomputed_steps=1,
    )
    ledger.record("failure", **_failure(0, T0 + 90, step=8))
    ledger.record(
        "job_end",
        t=T0 + 100,
        status="failed",
        reason=HOSTILE_REASON,
        traceback="<script>alert('end')</script>",
        steps_committed=8,
    )
    ledger.close()
    return run_dir


def test_timeline_takes_its_points_and_stalls_from_the_ledger(tmp_path):
    run_dir = write_ledger(tmp_path)
    timeline = build_timeline(read_ledger(run_dir / "ledger.jsonl"), summarize(run_dir))
    points = [(p.t, p.steps, p.source) for p in timeline.points]
    assert points == [
        (0.0, 0, "job_start"),
        (3.0, 0, "all workers joined"),
        (10.0, 5, "failure onset"),
        (15.0, 5, "first step after recovery"),
        (90.0, 8, "unrecovered failure"),
        (100.0, 8, "job_end"),
    ]
    assert [(s.start, s.end, s.failures, s.recovered) for s in timeline.stalls] == [
        (10.0, 15.0, (0,), True),
        (90.0, 100.0, (1,), False),
    ]
    assert timeline.wall_seconds == 100.0
    assert timeline.stalled_seconds == 15.0
    assert timeline.goodput == pytest.approx(0.85)


def test_overlapping_stalls_count_once(tmp_path):
    run_dir = write_ledger(tmp_path)
    timeline = build_timeline(read_ledger(run_dir / "ledger.jsonl"), summarize(run_dir))
    doubled = type(timeline)(timeline.start, 100.0, timeline.points, timeline.stalls * 2)
    assert doubled.stalled_seconds == 15.0


def test_page_shows_the_summary_and_escapes_ledger_text(tmp_path):
    page = render(write_ledger(tmp_path))
    assert "<script" not in page.lower()  # the page has no script of its own either
    assert "&lt;script&gt;alert(&quot;trace&quot;)&lt;/script&gt;" in page
    assert "&lt;script&gt;alert(&#x27;end&#x27;)&lt;/script&gt;" in page
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<b>boom</b>" not in page and "&lt;b&gt;boom&lt;/b&gt;" in page
    assert "1/2 (50%)" in page  # zero-loss share: one of two failures
    assert "85.0%" in page  # goodput
    assert "123,456" in page and "5.00 s" in page
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 2


def test_cli_writes_the_page(tmp_path):
    run_dir = write_ledger(tmp_path / "run")
    out = tmp_path / "report.html"
    done = cli("report", str(run_dir), "--html", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps_committed"] == 8  # stdout stays the JSON report
    assert done.stderr.strip() == f"wrote {out}"
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_cost_view_says_why_it_is_missing_for_a_run_without_failures(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.record("job_start", t=T0, world_size=1, spares=0)
    ledger.record("job_end", t=T0 + 5, status="succeeded", steps_committed=3)
    ledger.close()
    page = render(tmp_path)
    assert "Not available:" in page and "no &#x27;failure&#x27; events" in page
    assert "0/0" in page and "100.0%" in page  # no failure: nothing stalled


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing-run", "not found"),
        ("missing-out-dir", "cannot write"),
        ("out-is-dir", "cannot write"),
        ("empty-ledger", "has no events yet"),
    ],
)
def test_bad_paths_are_one_line_errors(tmp_path, case, expected):
    run_dir = write_ledger(tmp_path / "run")
    out = {
        "missing-run": tmp_path / "r.html",
        "missing-out-dir": tmp_path / "nowhere" / "r.html",
        "out-is-dir": tmp_path,
        "empty-ledger": tmp_path / "r.html",
    }[case]
    if case == "missing-run":
        run_dir = tmp_path / "nothing"
    if case == "empty-ledger":
        (run_dir / "ledger.jsonl").write_text("")
    done = cli("report", str(run_dir), "--html", str(out))
    assert done.returncode == 1
    assert expected in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
