"""Slurm without Slurm: hostlist expressions and the srun environment -> launcher flags, as
pure functions (the real Slurm runs in tests/test_slurm_multiprocess.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import SCRIPTS, cli
from torchrelay.agent.slurm import (
    Placement,
    SlurmError,
    SlurmStep,
    default_port,
    parse_hostlist,
    place,
    slurm_step,
)
from torchrelay.cli.main import build_parser
from torchrelay.cli.run import config_from_args


@pytest.mark.parametrize(
    "expression,hosts",
    [
        ("localhost", ["localhost"]),
        ("gpu[01-03,7],cpu5", ["gpu01", "gpu02", "gpu03", "gpu7", "cpu5"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("rack[1,3]-node[09-10].ib", [
            "rack1-node09.ib", "rack1-node10.ib", "rack3-node09.ib", "rack3-node10.ib",
        ]),
        ("a,b[2],c", ["a", "b2", "c"]),
        ("[1-2]x", ["1x", "2x"]),
        ("node[5]", ["node5"]),
    ],
)  # fmt: skip
def test_hostlist_expands_like_slurm(expression, hosts):
    assert parse_hostlist(expression) == hosts


@pytest.mark.parametrize(
    "expression,message",
    [
        ("", "empty name"),
        ("a,,b", "empty name"),
        ("gpu[01-03", "unclosed bracket"),
        ("gpu01-03]", "unbalanced"),
        ("gpu[1-[2]]", "nested"),
        ("gpu[]", "not a number or a range"),
        ("gpu[a-b]", "not a number or a range"),
        ("gpu[1-2-3]", "not a number or a range"),
        ("gpu[5-3]", "runs backwards"),
        ("n[0-9999999]", "more than"),
        ("a[0-2000]b[0-2000]", "more than"),
    ],
)
def test_bad_hostlist_is_one_line_error(expression, message):
    with pytest.raises(SlurmError, match=message.replace("[", r"\[")) as error:
        parse_hostlist(expression)
    assert "\n" not in str(error.value)


def step_env(**changes: str | None) -> dict[str, str]:
    """What `srun -N2 --ntasks-per-node=1` gives the task on the second node of job 4242."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_NTASKS_PER_NODE": "1",
    }
    env.update({k: v for k, v in changes.items() if v is not None})
    return {k: v for k, v in env.items() if changes.get(k, "") is not None}


def test_two_node_step_is_read_from_the_environment():
    step = slurm_step(step_env())
    assert step == SlurmStep(job_id=4242, step_id=0, nnodes=2, node_rank=1, rdzv_host="gpu07")
    assert step.rdzv_endpoint == f"gpu07:{default_port(4242)}"
    assert step.run_dir == Path("runs/slurm-4242")
    assert slurm_step(step_env(SLURM_STEP_ID="3")).run_dir == Path("runs/slurm-4242.3")


def test_older_variable_names_are_the_fallback():
    env = step_env(
        SLURM_STEP_NUM_NODES=None,
        SLURM_NNODES=None,
        SLURM_STEP_NODELIST=None,
        SLURM_STEP_TASKS_PER_NODE=None,
        SLURM_TASKS_PER_NODE=None,
    )
    assert slurm_step(env) == SlurmStep(4242, 0, 2, 1, "gpu07")


@pytest.mark.parametrize("missing", ["SLURM_JOB_ID", "SLURM_STEP_ID"])
def test_outside_a_step_slurm_is_ignored(missing):
    # A batch script or an salloc shell has a job id but no step: one node, as without Slurm.
    assert slurm_step(step_env(**{missing: None})) is None
    assert slurm_step({}) is None


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, "--ntasks-per-node=1"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1,2"}, "--ntasks-per-node=1"),
        (
            {"SLURM_STEP_TASKS_PER_NODE": None, "SLURM_TASKS_PER_NODE": None,
             "SLURM_NTASKS_PER_NODE": "4"},
            "--nproc-per-node",
        ),
        ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "not a Slurm task count"),
        ({"SLURM_NODEID": "2"}, "outside this step's 2 nodes"),
        ({"SLURM_NODEID": None}, "none of SLURM_NODEID"),
        ({"SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID='12_3' is not a number"),
        ({"SLURM_STEP_NODELIST": "gpu07"}, "fewer than the step's 2 nodes"),
        ({"SLURM_STEP_NODELIST": "gpu[07-"}, "unclosed bracket"),
    ],
)  # fmt: skip
def test_unusable_slurm_environment_is_one_line_error(changes, message):
    with pytest.raises(SlurmError) as error:
        slurm_step(step_env(**changes))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_default_port_and_its_control_port_stay_in_range():
    ports = {default_port(job) for job in range(0, 200_000, 7)}
    assert min(ports) >= 20000 and max(ports) + 1 < 32768  # below the ephemeral range
    assert all(port % 2 == 0 for port in ports)  # port + 1 (the controller) is the pair's
    assert default_port(4242) != default_port(4243)


STEP = SlurmStep(job_id=77, step_id=0, nnodes=2, node_rank=1, rdzv_host="gpu07")


def test_slurm_fills_what_the_flags_leave_out():
    assert place(Placement(), STEP) == Placement(
        2, 1, f"gpu07:{default_port(77)}", Path("runs/slurm-77")
    )
    assert place(Placement(), None) == Placement()  # no Slurm: the CLI's defaults


def test_explicit_flags_win():
    flags = Placement(2, 1, "10.0.0.1:29500", Path("/scratch/run"))
    assert place(flags, STEP) == flags


@pytest.mark.parametrize(
    "flags,message",
    [
        (Placement(nnodes=3), "--nnodes 3 contradicts this Slurm step (2"),
        (Placement(node_rank=0), "--node-rank 0 contradicts this Slurm step (1"),
    ],
)
def test_contradicting_flag_is_one_line_error(flags, message):
    with pytest.raises(SlurmError, match=message.replace("(", r"\(")):
        place(flags, STEP)


def test_one_node_step_keeps_a_loopback_store():
    # Nothing else has to reach a one-node job's store: no fixed port, no external address.
    one = SlurmStep(job_id=77, step_id=0, nnodes=1, node_rank=0, rdzv_host="gpu07")
    assert place(Placement(), one) == Placement(1, 0, None, Path("runs/slurm-77"))


def parse(*argv: str):
    return build_parser().parse_args(["run", *argv, "train.py"])


def test_cli_under_srun_needs_no_per_node_flags():
    config = config_from_args(parse("--nproc-per-node", "4"), step_env())
    assert (config.nnodes, config.node_rank, config.world_size) == (2, 1, 8)
    assert (config.master_addr, config.master_port) == ("gpu07", default_port(4242))
    assert config.run_dir == Path("runs/slurm-4242")
    # Without srun, the torchrun defaults.
    plain = config_from_args(parse(), {})
    assert (plain.nnodes, plain.node_rank, plain.master_addr, plain.master_port) == (
        1,
        0,
        "127.0.0.1",
        0,
    )


def test_cli_chaos_is_checked_against_the_slurm_world():
    # rank 7 exists in 2 nodes x 4 workers, not in the one-node default.
    config = config_from_args(parse("--nproc-per-node", "4", "--chaos", "kill:rank=7:step=3"),
                              step_env())  # fmt: skip
    assert config.chaos[0].rank == 7


@pytest.mark.parametrize(
    "changes,argv,message",
    [
        ({}, ("--nnodes", "3"), "--nnodes 3 contradicts this Slurm step"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, (), "--ntasks-per-node=1"),
    ],
)
def test_cli_refuses_in_one_line(changes, argv, message):
    with pytest.raises(SystemExit, match="torchrelay run: ") as error:
        config_from_args(parse(*argv), step_env(**changes))
    assert message in str(error.value.code) and "\n" not in str(error.value.code)


def test_cli_process_under_bad_srun_environment_exits_with_one_line(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_STEP_NUM_NODES", "1")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "localhost")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2")
    done = cli("run", "--nproc-per-node", "2", "train.py")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "torchrelay run: Slurm started 2 tasks on a node, but torchrelay starts the workers "
        "itself: use `srun --ntasks-per-node=1` and give the workers per node with "
        "`--nproc-per-node`"
    ]


def test_two_node_step_without_a_job_token_is_told_to_export_one(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name, value in step_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHRELAY_JOB_TOKEN", raising=False)
    done = cli("run", "--nproc-per-node", "2", str(SCRIPTS / "mlp_train.py"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "$TORCHRELAY_JOB_TOKEN" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # refused before touching the run directory


def test_an_empty_endpoint_is_refused_not_defaulted():
    with pytest.raises(SystemExit, match="HOST:PORT"):
        config_from_args(parse("--rdzv-endpoint", ""), {})
