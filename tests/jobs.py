"""Run real torchrelay jobs from tests (subprocesses, real signals, real sockets)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchrelay.cli.operator import job_status

SCRIPTS = Path(__file__).parent / "scripts"


@dataclass
class JobResult:
    returncode: int
    output: str
    run_dir: Path

    def weights(self) -> dict[str, torch.Tensor]:
        return torch.load(self.run_dir / "final.pt", weights_only=True)

    def summary(self) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "torchrelay.cli.main", "report", str(self.run_dir), "--json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return json.loads(out.stdout)

    def ledger(self) -> list[dict[str, Any]]:
        lines = (self.run_dir / "ledger.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``torchrelay ARGS`` in a subprocess, capturing text output."""
    return subprocess.run(
        [sys.executable, "-m", "torchrelay.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_command(
    run_dir: Path,
    *,
    script: str = "mlp_train.py",
    nproc: int = 3,
    spares: int = 1,
    chaos: tuple[str, ...] = (),
    launcher_args: tuple[str, ...] = (),
    script_args: tuple[str, ...] = (),
    steps: int = 10,
    launcher: str | None = None,
    quiet: bool = True,
) -> list[str]:
    """``torchrelay run`` of a test script, ``quiet`` (no output on the console), its final
    weights to ``RUN_DIR/final.pt``; ``launcher``: a script in tests/scripts that stands in for
    ``torchrelay``."""
    return [
        sys.executable,
        *([str(SCRIPTS / launcher)] if launcher else ["-m", "torchrelay.cli.main"]),
        "run",
        "--nproc-per-node",
        str(nproc),
        "--spares",
        str(spares),
        "--run-dir",
        str(run_dir),
        *(["--quiet"] if quiet else []),
        *(f"--chaos={spec}" for spec in chaos),
        *launcher_args,
        str(SCRIPTS / script),
        "--steps",
        str(steps),
        "--out",
        str(run_dir / "final.pt"),
        *script_args,
    ]


def start_job(run_dir: Path, **options: Any) -> subprocess.Popen[str]:
    """Start a job (see :func:`job_command`) in its own process group, output captured."""
    return subprocess.Popen(
        job_command(run_dir, **options),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def run_job(run_dir: Path, *, timeout: float = 300, **options: Any) -> JobResult:
    """Run a job (see :func:`job_command` for the options) to its end."""
    command = job_command(run_dir, **options)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return JobResult(done.returncode, done.stdout + done.stderr, run_dir)


STORY_EVENTS = ("failure", "recovery_start", "recovery_planned", "recovery_failed", "recovery_done")


def assert_bitwise_equal(
    ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], job: JobResult | None = None
) -> None:
    """Equal bit for bit; on a difference, the job's recovery events and output say why."""
    assert ours.keys() == ref.keys()
    different = [k for k in ref if not torch.equal(ours[k], ref[k])]
    story = ""
    if different and job is not None:
        events = [e for e in job.ledger() if e["event"] in STORY_EVENTS]
        story = "\n" + "\n".join(map(json.dumps, events)) + "\n" + job.output[-4000:]
    assert not different, f"tensors differ from the failure-free run: {different}{story}"


def injected_failures(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The failures a job's chaos schedule caused, after checking the others.

    A survivor can also leave on its own, with exit 71 (failure kind ``communicator``). Torch
    2.13's gloo never ends a send that an aborted generation left queued, so that survivor
    leaves and is replaced like a failed worker (README, Limits). A test counts the failures
    it injected, not that one. That exit must still be recovered, with nothing lost.
    """
    own = [f for f in summary["failures"] if f["kind"] == "communicator"]
    assert all(f["recovered"] and f["lost_steps"] == 0 for f in own), own
    return [f for f in summary["failures"] if f["kind"] != "communicator"]


def move_leash(leash: Path, step: int) -> None:
    """Let a job started with ``--leash LEASH`` run until it reaches ``step`` (see
    tests/scripts/mlp_train.py); written atomically, so the job never reads half a number."""
    part = leash.with_suffix(".part")
    part.write_text(str(step))
    part.replace(leash)


def await_status(run_dir, predicate: Callable[[dict], bool], timeout: float = 120) -> dict:
    """Poll the job's controller (another process) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "endpoint").exists():
            status = job_status(run_dir)
            if predicate(status):
                return status
        time.sleep(0.2)
    raise AssertionError("the job never reached the expected state")


def ledger_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of ``run_dir``'s ledger so far (none before the job has written one)."""
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def await_event(run_dir: Path, name: str, timeout: float = 120) -> dict[str, Any]:
    """The first ``name`` event of the ledger, once written (see :func:`await_events`)."""
    return await_events(run_dir, name, 1, timeout)[0]


def await_events(
    run_dir: Path, name: str, count: int, timeout: float = 120
) -> list[dict[str, Any]]:
    """The first ``count`` ``name`` events of the ledger, once written (polled; the timeout is
    a safety net, never the pace)."""
    deadline = time.monotonic() + timeout
    while len(found := [e for e in ledger_events(run_dir) if e["event"] == name]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{run_dir} never recorded {count} {name!r}")
        time.sleep(0.05)
    return found[:count]


def printed_lines(log_dir: Path, processes: list[str], timeout: float = 60) -> dict[str, str]:
    """The line each of ``processes`` printed to its log (``log_dir/<process>.log``, as the
    node agent writes them), once every one of them has ended its line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = {p: log_dir / f"{p}.log" for p in processes}
        text = {p: log.read_text() if log.exists() else "" for p, log in logs.items()}
        if all(t.endswith("\n") for t in text.values()):
            return {p: t.strip() for p, t in text.items()}
        time.sleep(0.05)
    raise AssertionError(f"not every one of {processes} printed its line: {text}")


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A free port P on ``host`` with P+1 free too (a multi-node job's store and controller)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind((host, 0))
            port = a.getsockname()[1]
            try:
                b.bind((host, port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


def start_node(
    node_rank: int,
    endpoint: str,
    run_dir: Path,
    *,
    token: str,
    steps: int,
    spares: int,
    launcher_args: tuple[str, ...] = (),
    script_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    wrapper: tuple[str, ...] = (),
    nnodes: int = 2,
    nproc: int = 2,
    quiet: bool = True,
) -> subprocess.Popen[str]:
    """Start node ``node_rank`` of an ``nnodes``-node job (``nproc`` workers each) as its own
    process group.

    ``wrapper`` prefixes the command (e.g. ``ip netns exec NS`` to put the node on a network of
    its own); ``env`` adds to the environment.
    """
    command = job_command(
        run_dir,
        nproc=nproc,
        spares=spares,
        steps=steps,
        launcher_args=(
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(node_rank),
            "--rdzv-endpoint",
            endpoint,
            *launcher_args,
        ),
        script_args=script_args,
        quiet=quiet,
    )
    return subprocess.Popen(
        [*wrapper, *command],
        env={**os.environ, "TORCHRELAY_JOB_TOKEN": token, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
