"""``python -m bench --quick`` end to end: every system runs and yields numbers (CI smoke)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.systems import SYSTEMS

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quick_benchmark_runs_every_system(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    jobs = results["jobs"]
    assert {j["system"] for j in jobs} == set(SYSTEMS)
    for job in jobs:
        assert job["error"] is None, job
        assert job["steady_steps_per_s"] and job["steady_steps_per_s"] > 0, job
        assert job["wall_s"] > 0
        if job["failures"]:
            assert len(job["kill_times"]) == job["failures"], job
            assert len(job["impacts"]) == job["failures"]
            assert all(not math.isnan(i["stall_s"]) for i in job["impacts"]), job
    relay = [j for j in jobs if j["system"] == "torchrelay" and j["failures"]]
    assert relay and all(j["phases"] for j in relay)
    assert all(v > 0 for v in results["broadcast_bytes_per_s"].values())
    report = (out / "benchmarks.md").read_text()
    assert "## Targets" in report and "n/a |" not in report.split("## Targets")[1][:200]
    assert (out / "bench_progress.png").stat().st_size > 10_000
