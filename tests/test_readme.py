"""The README's API snippet, run exactly as written under `torchrelay run` with a failure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.jobs import cli

ROOT = Path(__file__).resolve().parents[1]


def _api_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The API in ten lines", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_starts_with_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert (ROOT / "scripts" / "demo.sh").exists() and (ROOT / "scripts" / "test.sh").exists()


def test_api_snippet_is_ten_lines():
    code_lines = [line for line in _api_snippet().splitlines() if line.strip()]
    assert len(code_lines) <= 12


@pytest.mark.slow
def test_script_written_from_the_readme_survives_a_kill(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_api_snippet())
    run_dir = tmp_path / "run"
    done = cli(
        "run",
        "--nproc-per-node",
        "2",
        "--spares",
        "1",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--chaos",
        "kill:rank=1:step=40:phase=backward",
        str(script),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout and "zero-loss recoveries: 1/1" in done.stdout
