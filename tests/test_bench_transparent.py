"""``python -m bench.transparent`` end to end, one short pair (CI smoke): both launchers run the
same script to the end and the figures come from their steps and from the hook's timers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.transparent import ATTEMPTS, TORCH_TEARDOWN_ABORT, unless_torch_aborted

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


def _aborted(output: str) -> bool:
    return TORCH_TEARDOWN_ABORT in output


def test_a_run_is_tried_again_only_while_it_ends_in_torchs_teardown_abort() -> None:
    tried: list[int] = []

    def attempt(number: int) -> str:
        tried.append(number)
        return TORCH_TEARDOWN_ABORT if number < 2 else "a traceback"

    assert unless_torch_aborted(attempt, _aborted) == "a traceback"
    assert tried == [0, 1, 2]  # the other failure is not tried again
    tried.clear()
    assert unless_torch_aborted(lambda n: tried.append(n) or TORCH_TEARDOWN_ABORT, _aborted)
    assert tried == list(range(ATTEMPTS))  # and an abort every time ends after ATTEMPTS
