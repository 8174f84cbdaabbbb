"""Operator commands never import torch: `torchrelay --help`, `report`, `status`, `chaos` and
`simulate` answer in a fraction of a second instead of the seconds torch takes to load (a
drill sent with `torchrelay chaos` landed 40 steps late when it did). Only `run` and `demo`,
which train, load it, inside their handlers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Runs the real entry point in a fresh interpreter, then says whether torch got loaded.
PROBE = """
import json, sys
from torchrelay.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def probe(*argv: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("run", "--help"),
        ("demo", "--help"),
        ("simulate", "--preset", "claim-16k", "--replications", "20", "--run-days", "5"),
    ],
    ids=["help", "run-help", "demo-help", "simulate"],
)
def test_commands_that_do_not_train_do_not_import_torch(argv):
    result = probe(*argv)
    assert result == {"code": 0, "torch": False}


def test_report_status_and_chaos_do_not_import_torch(live_job):
    run_dir, agent = live_job.run_dir, live_job.agent
    assert probe("report", str(run_dir)) == {"code": 0, "torch": False}
    page = run_dir / "report.html"
    assert probe("report", str(run_dir), "--html", str(page)) == {"code": 0, "torch": False}
    assert page.exists()
    assert probe("status", str(run_dir)) == {"code": 0, "torch": False}
    drill = probe("chaos", "--run-dir", str(run_dir), "kill", "--rank", "0")
    assert drill == {"code": 0, "torch": False}
    assert agent.signals == [("worker0", 9)]  # the drill went all the way through


def test_the_package_loads_torch_on_first_use_of_its_api():
    # The probe is not blind: touching torchrelay.init (what a training script does) loads it.
    check = "import sys, torchrelay; {} print('torch' in sys.modules)"
    for touch, loaded in (("", "False"), ("torchrelay.init;", "True")):
        done = subprocess.run(
            [sys.executable, "-c", check.format(touch)], capture_output=True, text=True, timeout=120
        )
        assert done.stdout.strip() == loaded, done.stderr


def test_python_m_torchrelay_is_the_command():
    """``python -m torchrelay`` as ``python -m torch.distributed.run`` is torchrun: the same
    parser, the same one-line errors and exit codes."""
    done = subprocess.run(
        [sys.executable, "-m", "torchrelay", "run", "--nnodes", "1:2", "x.py"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr.startswith("torchrelay run: error: argument --nnodes")
        and done.stderr.count("\n") == 1
    )
    helped = subprocess.run(
        [sys.executable, "-m", "torchrelay", "--help"], capture_output=True, text=True, timeout=120
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: torchrelay ")
