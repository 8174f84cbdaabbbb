"""Bad input to the real command line: one line on stderr, a non-zero exit, no traceback and
no hang -- for every case an outside audit tried (issue 9, item 18)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.etcd import free_port
from tests.jobs import SCRIPTS

SCRIPT = str(SCRIPTS / "mlp_train.py")
EVENT = json.dumps({"t": 1.0, "event": "job_start", "world_size": 2})


def torchrelay(*args: str) -> subprocess.CompletedProcess[str]:
    # The timeout is the "never a hang" check: each case answers in well under a second idle.
    return subprocess.run(
        [sys.executable, "-m", "torchrelay.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for text in expected:
        assert text in done.stderr


def _ledger(content: bytes) -> Callable[[Path], list[str]]:
    def setup(tmp_path: Path) -> list[str]:
        (tmp_path / "ledger.jsonl").write_bytes(content)
        return ["report", str(tmp_path)]

    return setup


def _ledger_is_a_directory(tmp_path: Path) -> list[str]:
    (tmp_path / "ledger.jsonl").mkdir()
    return ["report", str(tmp_path)]


REPORT_CASES = {
    "garbage": (_ledger(b"hello, world\nnot json\n"), "not a torchrelay ledger"),
    "json-array": (_ledger(b"[1, 2, 3]\n"), "not a torchrelay ledger"),
    "truncated": (_ledger(EVENT[:20].encode()), "not a torchrelay ledger"),
    "binary": (_ledger(bytes(range(256)) * 4), "not UTF-8"),
    "malformed-event": (_ledger(b'{"t": 1.0, "event": "failure"}\n'), "malformed event"),
    "no-ledger": (lambda tmp_path: ["report", str(tmp_path)], "not found"),
    "ledger-is-a-directory": (_ledger_is_a_directory, "is a directory"),
}


@pytest.mark.parametrize("case", REPORT_CASES.values(), ids=REPORT_CASES.keys())
def test_report_on_what_is_not_a_ledger(tmp_path, case):
    setup, expected = case
    assert_one_line_error(torchrelay(*setup(tmp_path)), "torchrelay report:", expected)


def test_report_of_a_ledger_torn_mid_line_still_reads(tmp_path):
    # What a crash of the launcher leaves (the last line half-written) is not bad input.
    (tmp_path / "ledger.jsonl").write_text(EVENT + "\n" + EVENT[:20])
    done = torchrelay("report", str(tmp_path))
    assert done.returncode == 0 and "running" in done.stdout, done.stderr


def _run(tmp_path: Path, *flags: str) -> list[str]:
    return ["run", "--run-dir", str(tmp_path / "run"), *flags, SCRIPT]


def _unwritable(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root writes anywhere but in a pseudo file system
        return Path("/sys/torchrelay-test/run")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    return locked / "run"


RUN_CASES = {
    "run-dir-under-a-file": (
        lambda tmp_path: ["run", "--run-dir", str(_file(tmp_path) / "run"), SCRIPT],
        "cannot use --run-dir",
    ),
    "run-dir-not-permitted": (
        lambda tmp_path: ["run", "--run-dir", str(_unwritable(tmp_path)), SCRIPT],
        "cannot use --run-dir",
    ),
    "chaos-seconds-nan": (
        lambda tmp_path: _run(tmp_path, "--chaos", "slow:rank=0:step=1:seconds=nan"),
        "finite",
    ),
    "chaos-seconds-inf": (
        lambda tmp_path: _run(tmp_path, "--chaos", "slow:rank=0:step=1:seconds=inf"),
        "finite",
    ),
    "partition-seconds-inf": (
        lambda tmp_path: _run(
            tmp_path,
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            "127.0.0.1:29400",
            "--chaos",
            "partition:node=1:step=1:seconds=inf",
        ),
        "finite",
    ),
    "spare-timeout-negative": (
        lambda tmp_path: _run(tmp_path, "--spare-timeout", "-1"),
        "--spare-timeout must be",
    ),
    "spare-timeout-zero": (
        lambda tmp_path: _run(tmp_path, "--spare-timeout", "0"),
        "--spare-timeout must be",
    ),
    "spare-timeout-nan": (
        lambda tmp_path: _run(tmp_path, "--spare-timeout", "nan"),
        "--spare-timeout must be",
    ),
    "halt-timeout-negative": (
        lambda tmp_path: _run(tmp_path, "--halt-timeout", "-5"),
        "--halt-timeout must be",
    ),
    "halt-timeout-inf": (
        lambda tmp_path: _run(tmp_path, "--halt-timeout", "inf"),
        "--halt-timeout must be",
    ),
    "node-timeout-negative": (
        lambda tmp_path: _run(tmp_path, "--node-timeout", "-1"),
        "--node-timeout must be",
    ),
    "hang-floor-zero": (lambda tmp_path: _run(tmp_path, "--hang-floor", "0"), "--hang-floor"),
    "max-restarts-negative": (
        lambda tmp_path: _run(tmp_path, "--max-restarts", "-1"),
        "--max-restarts must be",
    ),
    "nproc-absurd": (
        lambda tmp_path: _run(tmp_path, "--nproc-per-node", "100000"),
        "--nproc-per-node must be in [1, 256]",
    ),
    "nproc-zero": (
        lambda tmp_path: _run(tmp_path, "--nproc-per-node", "0"),
        "--nproc-per-node must be in [1, 256]",
    ),
    "spares-absurd": (lambda tmp_path: _run(tmp_path, "--spares", "100000"), "--spares in"),
    "state-no-scheme": (lambda tmp_path: _run(tmp_path, "--state", "localhost:2379"), "--state"),
    "state-other-scheme": (
        lambda tmp_path: _run(tmp_path, "--state", "redis://localhost:6379"),
        "--state must be 'memory' or 'etcd://HOST:PORT[/PREFIX]'",
    ),
    "state-no-port": (lambda tmp_path: _run(tmp_path, "--state", "etcd://localhost"), "PORT"),
    "state-port-range": (lambda tmp_path: _run(tmp_path, "--state", "etcd://h:70000"), "PORT"),
    "state-bad-prefix": (lambda tmp_path: _run(tmp_path, "--state", "etcd://h:1/a b"), "PREFIX"),
    "state-etcd-unreachable": (
        lambda tmp_path: _run(tmp_path, "--state", f"etcd://127.0.0.1:{free_port()}"),
        "failed: cannot connect (is etcd running there",
    ),
    "metrics-port-range": (
        lambda tmp_path: _run(tmp_path, "--metrics-port", "70000"),
        "--metrics-port must be in 1..65535",
    ),
    "metrics-port-negative": (
        lambda tmp_path: _run(tmp_path, "--metrics-port", "-1"),
        "--metrics-port must be in 1..65535",
    ),
    "elastic-one-process": (
        lambda tmp_path: _run(tmp_path, "--nproc-per-node", "1", "--elastic"),
        "--elastic needs 2 or more processes",
    ),
    "min-nproc-without-elastic": (
        lambda tmp_path: _run(tmp_path, "--nproc-per-node", "2", "--min-nproc", "1"),
        "--min-nproc needs --elastic",
    ),
    "min-nproc-above-world": (
        lambda tmp_path: _run(tmp_path, "--nproc-per-node", "2", "--elastic", "--min-nproc", "3"),
        "--min-nproc must be in [1, 2]",
    ),
    "nproc-not-a-number": (
        lambda tmp_path: _run(tmp_path, "--nproc-per-node", "four"),
        "'four' is not a number, gpu, cpu or auto",
    ),
}


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("")
    return path


@pytest.mark.parametrize("case", RUN_CASES.values(), ids=RUN_CASES.keys())
def test_run_refuses_bad_arguments_before_starting_anything(tmp_path, case):
    setup, expected = case
    done = torchrelay(*setup(tmp_path))
    assert_one_line_error(done, "torchrelay run", expected)
    assert not (tmp_path / "run" / "ledger.jsonl").exists()


SIMULATE_CASES = {
    "seed-negative": (["--seed", "-1"], "seed: must be an integer >= 0"),
    "gpus-absurd": (["--gpus", "10000000000000"], "gpus: must be an integer >= 1 and <= 1,000,000"),
    "gpus-float": (["--gpus", "1e13"], "invalid int value"),
    "replications-absurd": (["--replications", "100000000"], "replications: must be"),
    "run-days-absurd": (["--run-days", "1e300"], "run_days: must be"),
}


@pytest.mark.parametrize("case", SIMULATE_CASES.values(), ids=SIMULATE_CASES.keys())
def test_simulate_refuses_what_it_cannot_compute(case):
    flags, expected = case
    assert_one_line_error(torchrelay("simulate", *flags), "torchrelay simulate", expected)


def test_run_refuses_a_metrics_port_in_use_before_starting_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = torchrelay(*_run(tmp_path, "--metrics-port", port))
    assert_one_line_error(done, "torchrelay run", f"--metrics-port {port}", "the port is in use")
    assert not (tmp_path / "run" / "ledger.jsonl").exists()


def test_report_into_a_closed_pipe_exits_quietly(tmp_path):
    # `torchrelay report RUN | head -1`: the reader is gone before the report is written.
    (tmp_path / "ledger.jsonl").write_text(EVENT + "\n")
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "torchrelay.cli.main", "report", str(tmp_path), "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.returncode == 141  # as a shell reports a tool ended by SIGPIPE
    assert done.stderr == ""
