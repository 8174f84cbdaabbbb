"""torchrun's command line on ``torchrelay run`` (:mod:`torchrelay.cli.torchrun_flags`): the
flags map onto torchrelay's or are refused in one line, and a worker sees torchrun's variables.
The real runs put one command line under torchrun and under torchrelay, changing one word."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.transparent import torch_aborted, unless_torch_aborted
from tests.jobs import (
    SCRIPTS,
    JobResult,
    assert_bitwise_equal,
    free_port_pair,
    job_command,
    run_job,
)
from tests.snapshots import require_criu
from torchrelay.agent.torchrun_env import torchrun_environment
from torchrelay.cli.main import build_parser
from torchrelay.cli.run import config_from_args
from torchrelay.cli.torchrun_flags import check_entry, processes

REPO = Path(__file__).resolve().parent.parent


def _config(*flags: str):
    args = build_parser().parse_args(["run", *flags, "train.py", "--lr", "1"])
    return config_from_args(args, environ={})


def test_torchrun_flags_map_onto_the_store_address_and_the_job():
    standalone = _config("--standalone", "--nproc_per_node=2")
    assert (standalone.master_addr, standalone.master_port, standalone.nnodes) == (
        "127.0.0.1",
        0,
        1,
    )
    master = _config(
        "--nnodes=2:2", "--node_rank=1", "--master_addr=10.0.0.5", "--master_port=4000"
    )
    assert (master.master_addr, master.master_port, master.nnodes, master.node_rank) == (
        "10.0.0.5",
        4000,
        2,
        1,
    )
    assert _config("--master-addr", "10.0.0.5").master_port == 29500  # torchrun's default
    c10d = _config("--rdzv-backend=c10d", "--rdzv-endpoint=h:5", "--rdzv-id=abc", "-m")
    assert (c10d.master_addr, c10d.master_port, c10d.run_id, c10d.module) == ("h", 5, "abc", True)
    assert c10d.script == "train.py" and c10d.script_args == ["--lr", "1"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--nnodes", "1:4"), "elastic range"),
        (("--nnodes", "two"), "is not N or N:N"),
        (("--rdzv-backend", "etcd"), "--state etcd://"),
        (("--standalone", "--master-port", "3"), "--standalone puts the store"),
        (("--standalone", "--rdzv-endpoint", "h:3"), "--standalone puts the store"),
        (("--standalone", "--nnodes", "2"), "--standalone is one node, not 2"),
        (("--master-addr", "h", "--rdzv-endpoint", "h:1"), "not both"),
    ],
)
def test_what_torchrelay_cannot_do_is_refused_in_one_line(flags, says, capsys):
    with pytest.raises(SystemExit) as stopped:
        _config(*flags)
    message = str(stopped.value) if stopped.value.code != 2 else capsys.readouterr().err
    assert says in message and message.strip().count("\n") == 0


def test_a_module_is_found_as_python_m_finds_it_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.chdir(tmp_path)
    check_entry("mypkg.train", module=True)  # found from the working directory, not imported
    check_entry("json.tool", module=True)
    with pytest.raises(SystemExit, match="'nopkg' is on no path"):
        check_entry("nopkg.train", module=True)
    with pytest.raises(SystemExit, match="not found"):
        check_entry(str(tmp_path / "missing.py"), module=False)


def test_processes_per_node_as_torchrun_counts_them():
    assert processes("3") == 3 and processes("cpu") == os.cpu_count()
    gpus = torch.cuda.device_count()
    assert processes("auto") == (gpus or os.cpu_count())
    if gpus:
        assert processes("gpu") == gpus
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="no CUDA device is visible"):
            processes("gpu")
    with pytest.raises(argparse.ArgumentTypeError, match="not a number, gpu, cpu or auto"):
        processes("four")


def test_the_torchrun_variables_follow_the_job(tmp_path):
    config = _config(
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-endpoint",
        "h:7",
        "--run-dir",
        str(tmp_path / "r"),
    )
    env = torchrun_environment(config, "h", 7)
    assert env["GROUP_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "1"
    assert env["ROLE_WORLD_SIZE"] == env["WORLD_SIZE"] == "2"
    assert env["TORCHELASTIC_RUN_ID"] == "r"  # the run directory's name, without --rdzv-id
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
    config.fallback = (2, "no live replica")
    assert torchrun_environment(config, "h", 7)["TORCHELASTIC_RESTART_COUNT"] == "2"


def _env_seen(directory: Path) -> dict[str, dict[str, str | None]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("rank*.json"))}


def _run_once(head: list[str], common: list[str], out: Path) -> subprocess.CompletedProcess:
    """The command line under ``head``; again (up to ATTEMPTS times) if its only fault was
    torch's teardown abort after the last step (pytorch#190489, under torchrun as here)."""

    def attempt(number: int) -> subprocess.CompletedProcess:
        run_dir = ["--run-dir", str(out / f"run{number}")] if "torchrelay.cli.main" in head else []
        command = [*head, *run_dir, *common]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)

    return unless_torch_aborted(
        attempt,
        lambda done: torch_aborted(done.returncode, done.stdout + done.stderr),
    )


@pytest.mark.slow
def test_a_torchrun_command_line_runs_by_changing_one_word(tmp_path):
    """The same command line, a module with torchrun's multi-node rendezvous flags and
    torchtitan's console flags, under ``torchrun`` and ``torchrelay run --transparent``: both
    end well with the same weights, show rank 0's output alone, and the workers see the same
    torchrun variables (the store's address aside)."""
    require_criu()  # --transparent runs an unmodified script
    seen: dict[str, dict] = {}
    for launcher in ("torchrun", "torchrelay"):
        out = tmp_path / launcher
        out.mkdir()
        common = [
            "--nnodes=1",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port_pair()}",
            "--rdzv-id=compat",
            "--max-restarts=2",  # the defaults differ: torchrun's 0, torchrelay's 3
            "--local-ranks-filter=0",  # torchtitan's console flags
            "--role=rank",
            "--tee=3",
            "-m",
            "tests.scripts.torchrun_ddp",
            "--steps",
            "5",
            "--out",
            str(out / "final.pt"),
            "--env-out",
            str(out),
        ]
        head = [sys.executable, "-m", "torch.distributed.run"]
        if launcher == "torchrelay":
            head = [sys.executable, "-m", "torchrelay.cli.main", "run", "--transparent"]
            head += ["--spares", "0"]
        done = _run_once(head, common, out)
        assert done.returncode == 0, done.stdout + done.stderr
        # The console shows rank 0's output alone, with torchrun's prefix.
        assert "[rank0]:rank 0 trained 5 steps\n" in done.stdout, done.stdout
        assert "rank 1 trained" not in done.stdout + done.stderr
        seen[launcher] = _env_seen(out)
    assert sorted(seen["torchrelay"]) == sorted(seen["torchrun"]) == ["rank0", "rank1"]
    for rank in ("rank0", "rank1"):
        ours, theirs = dict(seen["torchrelay"][rank]), dict(seen["torchrun"][rank])
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            assert ours.pop(name) and theirs.pop(name)
        # How often each launcher restarted its whole group (torchrun does, within its
        # --max-restarts, after a failure of its own, such as torch's teardown abort).
        assert ours.pop("TORCHELASTIC_RESTART_COUNT") == "0"
        assert theirs.pop("TORCHELASTIC_RESTART_COUNT").isdigit()
        assert ours == theirs
        assert ours["TORCHELASTIC_RUN_ID"] == "compat"
    ours = torch.load(tmp_path / "torchrelay" / "final.pt", weights_only=True)
    theirs = torch.load(tmp_path / "torchrun" / "final.pt", weights_only=True)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.slow
def test_a_model_aware_module_runs_from_the_template_as_its_script_does(tmp_path):
    """``-m tests.scripts.mlp_train``: workers and spares forked from the node's template run
    the module; a kill is recovered and the weights equal those of the script's run."""
    options = {"nproc": 2, "spares": 1, "steps": 8, "chaos": ("kill:rank=1:step=4",)}
    script = run_job(tmp_path / "script", **options)
    assert script.returncode == 0, script.output
    command = job_command(tmp_path / "module", **options)
    where = command.index(str(SCRIPTS / "mlp_train.py"))
    command[where : where + 1] = ["-m", "tests.scripts.mlp_train"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    module = JobResult(done.returncode, done.stdout + done.stderr, tmp_path / "module")
    assert module.returncode == 0, module.output
    assert [e["event"] for e in module.ledger()].count("recovery_done") == 1
    assert_bitwise_equal(module.weights(), script.weights(), module)
