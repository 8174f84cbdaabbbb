"""The command line: clear, actionable errors for bad input; torchrun-compatible flags."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import cli
from torchrelay.agent.fallback import resume_command
from torchrelay.cli.main import build_parser
from torchrelay.cli.run import config_from_args
from torchrelay.ledger import Ledger


def test_torchrun_spellings_are_accepted(tmp_path):
    args = build_parser().parse_args(
        [
            "run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "4",
            "--max_restarts",
            "2",
            "--rdzv_endpoint",
            "127.0.0.1:29500",
            "--run-dir",
            str(tmp_path),
            "train.py",
            "--lr",
            "3e-4",
        ]
    )
    config = config_from_args(args)
    assert (config.nproc_per_node, config.max_restarts, config.master_port) == (4, 2, 29500)
    assert config.script_args == ["--lr", "3e-4"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["run", "--chaos", "kill:rank=9:step=1", "--nproc-per-node", "2", "x.py"],
            "outside the job",
        ),
        (["run", "--chaos", "boom", "x.py"], "unknown action"),
        (["run", "--nnodes", "2", "x.py"], "fixed --rdzv-endpoint"),
        (["run", "--nnodes", "2", "--node-rank", "2", "x.py"], "--node-rank must be"),
        (["run", "--rdzv-endpoint", "nohost", "x.py"], "HOST:PORT"),
        (["run", "does_not_exist.py"], "not found"),
        (["report", "/nonexistent/run"], "a torchrelay run directory"),
    ],
)
def test_bad_input_gets_a_clear_error(argv, message):
    done = cli(*argv)
    assert done.returncode != 0
    assert message in done.stderr


def test_script_without_the_launcher_is_told_how_to_start():
    done = subprocess.run(
        [sys.executable, "-c", "import torchrelay; torchrelay.init()"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": ""},
    )
    assert done.returncode != 0 and "torchrelay run" in done.stderr


def test_report_json_has_the_documented_fields(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.record("job_start", t=100.0, world_size=2, spares=1)
    ledger.record(
        "failure",
        t=110.0,
        slot=1,
        process="worker1",
        last_reported_step=4,
        cause="SIGKILL",
        kind="signal",
        detected_by="process exit (waitpid)",
    )
    timeline = {
        "detected": 110.0,
        "spare_ready": 110.0,
        "halted": 110.1,
        "planned": 110.1,
        "comm_ready": 110.2,
        "transfer_done": 110.3,
        "first_step": 110.5,
    }
    ledger.record(
        "recovery_done",
        t=110.5,
        slots=[1],
        target_step=4,
        timeline=timeline,
        failures=[{"process": "worker1"}],
        recovery_seconds=0.5,
        stall_seconds=0.6,
        bytes_transferred=1000,
        lost_steps=0,
        recomputed_steps=1,
    )
    ledger.record("job_end", t=120.0, status="succeeded", steps_committed=10)
    ledger.close()
    done = cli("report", str(tmp_path), "--json")
    summary = json.loads(done.stdout)
    assert summary["steps_committed"] == 10 and summary["zero_loss_recoveries"] == 1
    (failure,) = summary["failures"]
    assert failure["rank"] == 1 and failure["step"] == 5 and failure["recovery_seconds"] == 0.5
    assert failure["lost_steps"] == 0 and failure["recomputed_steps"] == 1
    assert failure["bytes_transferred"] == 1000
    assert sum(failure["phases"].values()) == pytest.approx(0.5)
    assert "recovered in 0.50 s" in cli("report", str(tmp_path)).stdout


CHECKPOINTS = ["--checkpoint-dir", "c", "--checkpoint-every", "5"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            ["-r", "3", *CHECKPOINTS],
            "-r 3 --checkpoint-dir c --checkpoint-every 5 --run-dir runs/x",
        ),
        (
            ["--run-dir", "r", "--resume", *CHECKPOINTS],
            "--run-dir r --checkpoint-dir c --checkpoint-every 5",
        ),
        (["--run-dir=r"], "--run-dir=r"),
        (["--log-dir", "logs", "--tee", "3"], "--tee 3 --run-dir runs/x"),
        (
            ["--log_dir=logs", *CHECKPOINTS],
            "--checkpoint-dir c --checkpoint-every 5 --run-dir runs/x",
        ),
    ],
)
def test_the_resume_command_names_the_jobs_run_directory(flags, named):
    """What a failed job with a checkpoint tells the user to run: its own command, plus
    ``--resume`` and, where it had no ``--run-dir``, the one it ran in (``--resume`` needs it);
    the script's own arguments stay as they were."""
    entry = ["train.py", "--log-dir", "tb"]
    command = resume_command(Path("runs/x"), flags, entry)
    assert command == f"torchrelay run --resume {named} train.py --log-dir tb"
    if "--checkpoint-dir" in flags:  # the command runs as it reads
        config = config_from_args(build_parser().parse_args(shlex.split(command)[1:]), {})
        assert config.script_args == ["--log-dir", "tb"]
        assert config.run_dir == Path("r" if "r" in flags else "runs/x")
