"""``python -m bench.transparent`` end to end, one short pair (CI smoke): both launchers run the
same script to the end and the figures come from their steps and from the hook's timers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_one_pair_yields_ratios_and_the_hooks_timings(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    command = [sys.executable, "-m", "bench.transparent", "--pairs", "1", "--steps", "30"]
    proc = subprocess.run(
        [*command, "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "steps/s, transparent / torchrun: median" in proc.stdout
    figures = json.loads(out.read_text())
    (pair,) = figures["pairs"]
    for side in ("torchrun", "torchrelay"):
        assert pair[side]["steps_per_s"] > 0 and pair[side]["cpu_s_per_step"] > 0
    assert pair["torchrun"]["hook"] == {}  # no hook under torchrun
    hook = pair["torchrelay"]["hook"]
    assert hook["_commit"]["calls"] == 30  # one commit per optimizer step
    # One boundary snapshot per step (taken before its first fetch), plus setup's.
    assert 30 <= hook["Boundary.take"]["calls"] <= 34
    assert hook["SlotStreams.record"]["calls"] == hook["Boundary.take"]["calls"]  # its mirror
