"""The HTML report of a real job with two kills: it carries the ledger's numbers and the
simulator's projection, is self-contained, escapes a hostile traceback, and renders in
headless Chromium (Debian's ``chromium``; scripts/setup.sh installs it) with its images
decoded. Missing Chromium skips the rendering test, except under CI=true (then it fails)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.jobs import cli, run_job
from torchrelay.report.html import render

pytestmark = pytest.mark.slow

# Run by Chromium once the page (images included) has loaded: the DOM it dumps then says
# how many figures there are and how wide each image decoded.
PROBE = (
    '<script>window.addEventListener("load", () => {'
    "document.body.dataset.figures = document.querySelectorAll('figure').length;"
    "document.body.dataset.widths = [...document.images]"
    ".map(i => i.complete ? i.naturalWidth : 0).join(',');});</script>"
)


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory):
    """A 3-rank job killed at rank 1 step 3 and rank 0 step 6, its summary and its page."""
    run_dir = tmp_path_factory.mktemp("html") / "run"
    job = run_job(run_dir, chaos=("kill:rank=1:step=3", "kill:rank=0:step=6"))
    assert job.returncode == 0, job.output
    out = run_dir.parent / "report.html"
    done = cli("report", str(run_dir), "--html", str(out))
    assert done.returncode == 0, done.stderr
    return job, job.summary(), out


def card(page: str, label: str) -> str:
    """The value shown on the headline card ``label``."""
    found = re.search(r'<div class="v[^"]*">([^<]*)</div><div class="k">' + re.escape(label), page)
    assert found, f"no card {label!r}"
    return found.group(1)


def test_page_carries_the_ledgers_numbers(killed_twice):
    _, summary, out = killed_twice
    page = out.read_text()
    failures = summary["failures"]
    assert len(failures) == 2 and all(f["recovered"] for f in failures)
    zero = summary["zero_loss_recoveries"]
    assert card(page, "failures recovered with zero lost progress").startswith(f"{zero}/2")
    assert card(page, "committed steps") == f"{summary['steps_committed']:,}"
    assert card(page, "wall time") == f"{summary['wall_seconds']:.2f} s"
    stalled = sum(f["stall_seconds"] for f in failures)  # one recovery each, no overlap
    assert card(page, "stalled by failures") == f"{stalled:.2f} s"
    goodput = 1 - stalled / summary["wall_seconds"]
    assert card(page, "goodput") == f"{goodput:.1%}"
    rows = re.findall(r"<tr><td class=l>F\d</td>(.*?)</tr>", page)
    assert len(rows) == 2 * 2  # the breakdown table and the failure table
    for row, f in zip(rows[2:], failures, strict=True):
        cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
        assert cells[:4] == [f["kind"], f["cause"], str(f["rank"]), str(f["step"])]
        assert f"{f['recovery_seconds']:.2f} s" in cells
        assert cells[-4:] == [
            str(f["lost_steps"]),
            str(f["recomputed_steps"]),
            f"{f['bytes_transferred']:,}",
            str(f["resumed_at_step"]),
        ]
    for row, f in zip(rows[:2], failures, strict=True):
        cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
        assert cells == [f"{v * 1000:.0f}" for v in f["phases"].values()]


@pytest.mark.parametrize("gpus", [1024, 16384])
def test_cost_view_matches_simulate_from_run(killed_twice, gpus):
    job, _, out = killed_twice
    page = out.read_text()
    done = cli("simulate", "--from-run", str(job.run_dir), "--gpus", str(gpus), "--json")
    assert done.returncode == 0, done.stderr
    exact = json.loads(done.stdout)["closed_form"]["exact"]
    for strategy, label in (
        ("checkpoint-restart", "checkpoint-restart"),
        ("live-recovery", "live recovery (this run&#x27;s measurements)"),
    ):
        row = re.search(rf"<tr><td class=l>{gpus:,}</td>.*?<td class=l>{re.escape(label)}</td>"
                        r"<td>([^<]*)</td>", page)  # fmt: skip
        assert row, f"no {strategy} row at {gpus} GPUs"
        assert row.group(1) == f"{exact[strategy]['ettr']:.1%}"


def test_page_is_self_contained(killed_twice):
    page = killed_twice[2].read_text()
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?!data:)[a-z]+:", page, re.IGNORECASE)
    assert "url(" not in page and "@import" not in page
    assert not re.search(r"\b(?:https?|ftp|file|wss?):", page, re.IGNORECASE)
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2
    assert all(base64.b64decode(image).startswith(b"\x89PNG\r\n\x1a\n") for image in images)


def test_a_hostile_traceback_is_escaped(killed_twice, tmp_path):
    job = killed_twice[0]
    events = [json.loads(line) for line in (job.run_dir / "ledger.jsonl").read_text().split("\n")
              if line]  # fmt: skip
    for event in events:
        if event["event"] == "failure":
            event["traceback"] = "Traceback:\n<script>alert(document.cookie)</script>"
    (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    page = render(tmp_path)
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(document.cookie)&lt;/script&gt;") == 2


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        message = "chromium is not installed (bash scripts/setup.sh installs it as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return binary


def headless(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_page_renders_in_headless_chromium(killed_twice, tmp_path):
    from matplotlib.image import imread

    _, summary, out = killed_twice
    probe = tmp_path / "probe.html"
    probe.write_text(out.read_text().replace("</body>", PROBE + "</body>"))
    dom = headless(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    found = re.search(r'data-figures="(\d+)" data-widths="([\d,]*)"', dom)
    assert found, dom[:2000]
    assert found.group(1) == "2"
    widths = [int(w) for w in found.group(2).split(",")]
    assert len(widths) == 2 and all(w > 0 for w in widths), widths
    assert f"{summary['wall_seconds']:.2f} s" in dom and "Projected cost at scale" in dom
    shot = tmp_path / "report.png"
    headless(tmp_path, f"--screenshot={shot}", "--window-size=1000,1900", out.as_uri())
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (1900, 1000)
    # Not blank: a white page with dark text and the plots' coloured fills.
    assert (pixels.min(axis=2) < 0.2).mean() > 0.005
    assert (pixels.max(axis=2) - pixels.min(axis=2) > 0.3).mean() > 0.01
