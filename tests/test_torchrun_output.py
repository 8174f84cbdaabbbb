"""torchrun's output flags on ``torchrelay run`` (:mod:`torchrelay.cli.torchrun_output`) and
what the console shows of each process (:mod:`torchrelay.agent.console`). The real runs check
the console of a job whose shown rank is killed and refilled, on one node and on two."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from tests.jobs import (
    JobResult,
    assert_bitwise_equal,
    free_port_pair,
    job_command,
    run_job,
    start_node,
)
from tests.test_slurm import step_env
from torchrelay.agent.console import (
    HELD_LINES,
    Console,
    Seats,
    on_console,
    prefix,
    worker_slot,
)
from torchrelay.agent.torchrun_env import torchrun_environment
from torchrelay.cli.main import build_parser
from torchrelay.cli.run import config_from_args

REPO = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\[((?:rank\d+<)?(?:node\d+-)?(?:spare|rank)\d+)\]:(.*)$")


def _config(*flags: str, environ: dict[str, str] | None = None):
    args = build_parser().parse_args(["run", *flags, "train.py"])
    return config_from_args(args, environ=environ or {})


def test_a_process_is_shown_as_the_rank_it_serves():
    assert (worker_slot("worker3"), worker_slot("spare0"), worker_slot("workers")) == (
        3,
        None,
        None,
    )
    assert prefix("worker3", 3) == prefix("worker3", None) == "rank3"
    assert prefix("spare0", None) == "spare0"
    assert prefix("spare0", 2) == "rank2<spare0"
    seats = Seats()  # what another node's agent hears from the controller
    assert (seats.of("worker1"), seats.of("spare0")) == (1, None)
    seats.take("spare0", 5)
    assert seats.of("spare0") == 5


def test_the_console_shows_the_local_ranks_asked_for():
    assert on_console(None, 2, None) and on_console(3, 2, None)  # spares waiting too
    assert not on_console(None, 2, frozenset({0}))  # a spare, until it takes a shown slot
    assert on_console(2, 2, frozenset({0}))  # slot 2 is node 1's local rank 0
    assert not on_console(3, 2, frozenset({0}))
    assert not on_console(0, 2, frozenset())  # --quiet


def test_the_console_prints_whole_lines_of_the_ranks_shown(capsys):
    seats = Seats()
    console = Console(2, frozenset({0}), seats.of)
    for process, line in (("worker0", b"a\n"), ("worker1", b"b\n"), ("spare0", b"c\n")):
        console.show(process, line)
    assert capsys.readouterr().out == "[rank0]:a\n"  # spare0's line waits for its slot
    seats.take("spare0", 2)
    console.show("spare0", b"d\n")
    assert capsys.readouterr().out == "[rank2<spare0]:c\n[rank2<spare0]:d\n"


def test_a_spares_lines_wait_for_its_slot_and_go_where_that_slot_goes(capsys):
    """On another node a replacement's first lines can come before the ``seated`` notice: they
    are held, shown as the notice comes if the slot is shown, else dropped."""
    seats = Seats()
    console = Console(2, frozenset({0}), seats.of)
    for process in ("spare0", "spare1", "spare2"):
        console.show(process, f"{process} first\n".encode())
    console.release("spare0")  # no slot yet: still held
    assert capsys.readouterr().out == ""
    seats.take("spare0", 2)  # node 1's local rank 0: shown
    console.release("spare0")
    assert capsys.readouterr().out == "[rank2<spare0]:spare0 first\n"
    seats.take("spare1", 3)  # local rank 1: filtered out
    console.release("spare1")
    console.show("spare1", b"later\n")
    console.ended("spare2")  # dismissed without a slot
    seats.take("spare2", 2)
    console.show("spare2", b"as rank 2\n")
    assert capsys.readouterr().out == "[rank2<spare2]:as rank 2\n"
    for number in range(HELD_LINES + 5):  # a spare that never stops talking holds a bounded tail
        console.show("spare3", b"%d\n" % number)
    seats.take("spare3", 0)
    console.release("spare3")
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "[rank0<spare3]:5" and len(shown) == HELD_LINES


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        ((), None),
        (("--quiet",), frozenset()),
        (("--tee", "3"), None),
        (("--local-ranks-filter", "0"), {0}),
        (("--local-ranks-filter", "0,7"), {0, 7}),  # torchrun's filter, as is
        (("-r", "3"), frozenset()),
        (("-r", "3", "-t", "3"), None),  # teed as well: shown
        (("-r", "3", "-t", "0:3"), {0}),
        (("--redirects", "0:3,2:3"), {1, 3}),
        (("-r", "0:3", "--local_ranks_filter", "0,1"), {1}),
    ],
)
def test_redirects_tee_and_the_filter_choose_the_local_ranks_on_the_console(flags, shown):
    assert _config("--nproc-per-node", "4", *flags).console_ranks == shown


def test_log_dir_holds_the_run_directory_and_role_names_the_workers(tmp_path):
    config = _config("--log-dir", str(tmp_path), "--role", "trainer")
    assert config.run_dir.parent == tmp_path
    assert torchrun_environment(config, "h", 1)["ROLE_NAME"] == "trainer"
    assert _config().role == "default"
    under_srun = _config("--log-dir", str(tmp_path), environ=step_env(SLURM_NODEID="0"))
    assert under_srun.run_dir == tmp_path / "slurm-4242"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("-r", "1"), "--redirects 1 (local rank 0)"),
        (("-r", "0:3,1:2"), "--redirects 2 (local rank 1)"),
        (("-r", "4"), "is not 0..3"),
        (("--tee", "x"), "is not 0..3"),
        (("--local-ranks-filter", "a"), "is not LOCAL_RANK"),
        (("--log-dir", "d", "--run-dir", "e"), "pass one of them"),
        (("--no-python",), "--no-python: a worker here is a Python process"),
        (("--run-path",), "--run-path: each worker is a process of its own"),
        (("--rdzv-conf", "join_timeout=5"), "--rdzv-conf: torchrelay's store takes no"),
        (("--start-method", "thread"), "invalid choice"),
    ],
)
def test_output_flags_torchrelay_cannot_honour_are_refused_in_one_line(flags, says, capsys):
    with pytest.raises(SystemExit) as stopped:
        _config("--nproc-per-node", "2", *flags)
    message = str(stopped.value) if stopped.value.code != 2 else capsys.readouterr().err
    assert says in message and message.strip().count("\n") == 0


def test_flags_with_nothing_to_do_here_are_taken():
    config = _config("--monitor-interval", "0.5", "--start-method", "forkserver")
    assert config.nproc_per_node == 1


def _shown(output: str) -> list[tuple[str, str]]:
    """The (prefix, text) of every line the console showed of a worker or spare."""
    return [m.groups() for m in map(LINE.match, output.splitlines()) if m]  # type: ignore[misc]


def _console_job(out: Path, flags: tuple[str, ...], **options) -> subprocess.CompletedProcess:
    """A job of ``tests/scripts/mlp_train.py --print-steps`` with its output on the console
    and ``flags`` for the launcher; its final weights go to ``out/final.pt``."""
    command = job_command(out, script_args=("--print-steps",), quiet=False, **options)
    where = command.index("run") + 1
    command[where:where] = list(flags)
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_filtered_rank_stays_on_the_console_when_a_spare_takes_it_over(tmp_path):
    """``--local-ranks-filter 0`` (torchtitan's flags): rank 0 is killed mid-run; the spare
    that takes slot 0 is shown from then on as ``rank0<spare0``, nothing of rank 1 or of a
    waiting spare is, and every line is in the logs."""
    reference = run_job(tmp_path / "reference", nproc=2, spares=0, steps=8)
    assert reference.returncode == 0, reference.output
    flags = ("--local-ranks-filter", "0", "--role", "rank", "--tee", "3")
    options = {"nproc": 2, "spares": 1, "steps": 8, "chaos": ("kill:rank=0:step=4",)}
    done = _console_job(tmp_path / "run", flags, **options)
    job = JobResult(done.returncode, done.stdout + done.stderr, tmp_path / "run")
    assert job.returncode == 0, job.output
    shown = _shown(done.stdout)
    who = [w for w, _ in shown]
    assert set(who) == {"rank0", "rank0<spare0"}, done.stdout
    assert who == sorted(who), "the spare is shown once it took the slot, and from then on"
    steps = [int(text.split()[1]) for _, text in shown if text.startswith("step ")]
    assert sorted(set(steps)) == list(range(8)), done.stdout
    assert "step 7 " in (tmp_path / "run" / "logs" / "worker1.log").read_text()
    assert "spare1" in {p.stem for p in (tmp_path / "run" / "logs").iterdir()}  # refilled
    assert_bitwise_equal(job.weights(), reference.weights(), job)


@pytest.mark.slow
def test_redirected_output_is_in_the_logs_only_under_log_dir(tmp_path):
    """``-r 3 --log-dir DIR``: no worker's line on the console, all of them in the logs of a
    run directory made under DIR."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    done = _console_job(out, ("-r", "3"), nproc=2, spares=1, steps=3)
    assert done.returncode == 0, done.stdout + done.stderr
    command = job_command(
        out, nproc=2, spares=1, steps=3, script_args=("--print-steps",), quiet=False
    )
    where = command.index("--run-dir")
    command[where : where + 2] = ["--log-dir", str(logs), "-r", "3"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _shown(done.stdout) == [], done.stdout
    (run_dir,) = logs.iterdir()
    for rank in (0, 1):
        assert "step 2 " in (run_dir / "logs" / f"worker{rank}.log").read_text()


@pytest.mark.slow
def test_another_nodes_spare_is_shown_as_the_rank_it_took(tmp_path):
    """Two nodes of 2 workers, ``--local-ranks-filter 0`` on each; rank 2 (node 1's local rank
    0) is killed and node 1's spare takes it: node 1's console shows it as ``rank2<...>`` from
    then on (the controller tells node 1's agent), and never rank 3."""
    endpoint, token = f"127.0.0.1:{free_port_pair()}", secrets.token_hex(16)
    flags = ("--local-ranks-filter", "0")
    common = {"token": token, "steps": 8, "script_args": ("--print-steps",), "quiet": False}
    chaos = ("--chaos=kill:rank=2:step=4",)
    nodes = [
        start_node(
            0, endpoint, tmp_path / "node0", spares=0, launcher_args=flags + chaos, **common
        ),
        start_node(1, endpoint, tmp_path / "node1", spares=1, launcher_args=flags, **common),
    ]
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    job = JobResult(nodes[0].returncode, outputs[0], tmp_path / "node0")
    assert job.returncode == 0 and nodes[1].returncode == 0, outputs
    assert job.summary()["failures"][0]["rank"] == 2
    assert {who for who, _ in _shown(outputs[0])} == {"rank0"}, outputs[0]
    who = [w for w, _ in _shown(outputs[1])]
    assert set(who) == {"rank2", "rank2<node1-spare0"}, outputs[1]
    assert who == sorted(who), outputs[1]
