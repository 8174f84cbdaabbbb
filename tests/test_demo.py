"""`torchrelay demo` really trains, kills, recovers and proves bitwise equality."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_proves_bitwise_identical_weights(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrelay.cli.main",
            "demo",
            "--workers",
            "3",
            "--steps",
            "12",
            "--run-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final weights bitwise identical" in done.stdout
    assert "2 worker(s) killed, 0 committed steps lost" in done.stdout
    assert (tmp_path / "reference" / "final.pt").exists()
