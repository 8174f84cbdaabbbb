"""`torchrelay demo` really trains, kills, recovers and proves bitwise equality."""

from __future__ import annotations

import pytest

from tests.jobs import cli


@pytest.mark.slow
def test_demo_proves_bitwise_identical_weights(tmp_path):
    done = cli("demo", "--workers", "3", "--steps", "12", "--run-dir", str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final weights bitwise identical" in done.stdout
    assert "2 worker(s) killed, 0 committed steps lost" in done.stdout
    assert (tmp_path / "reference" / "final.pt").exists()
