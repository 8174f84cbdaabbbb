"""Process snapshots with the real CRIU (scripts/setup_criu.sh): a parked worker cloned and
migrated -- a toy process and a torch training process -- goes on exactly where it parked, each
copy obeying its own instructions; and a launcher's death takes its clones with it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import procs
from tests.jobs import SCRIPTS
from tests.snapshots import TOKEN, output, require_criu, start_worker
from torchrelay.transparent import cloner, criu
from torchrelay.transparent.park import Instruction, Kind

pytestmark = pytest.mark.slow
CONTINUE = Instruction(Kind.CONTINUE, generation=1)


def _steps(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("step ")]


def _reference(script: str, *args: str) -> list[str]:
    lines, status = output(start_worker(script, *args).process)
    assert status == 0, lines
    return _steps(lines)


def test_toy_clone_takes_its_own_identity(tmp_path: Path) -> None:
    require_criu()
    reference = _reference("park_toy.py", "8", "-1")
    worker = start_worker("park_toy.py", "8", "4")
    parked = worker.park()
    copy = cloner.clone(parked, tmp_path)
    assert copy.pid != worker.process.pid and copy.bytes > 0
    assert not any((tmp_path / "snapshots").iterdir()), "images are removed once restored"
    copy.channel.instruct(copy.notice, Instruction(Kind.BECOME, 2, slot=3), TOKEN)
    clone_lines, clone_status = output(copy.process)
    worker.channel.instruct(parked.notice, CONTINUE, TOKEN)
    donor_lines, donor_status = output(worker.process)
    # The donor printed steps 0-3 before the dump; the clone only what came after.
    assert _steps(donor_lines) == reference and donor_status == 0
    assert clone_lines[0] == "instruction become 3"
    assert _steps(clone_lines) == reference[4:]
    assert clone_status == 3, "the clone's exit status (its slot) reaches its agent"


@pytest.fixture(scope="module")
def mlp_reference() -> list[str]:
    require_criu()
    return _reference("park_mlp.py", "12", "-1")


@pytest.mark.parametrize("move", ["clone", "migrate"])
def test_torch_training_goes_on_exactly(tmp_path: Path, move: str, mlp_reference) -> None:
    reference = mlp_reference
    worker = start_worker("park_mlp.py", "12", "5")
    parked = worker.park()
    copy = getattr(cloner, move)(parked, tmp_path)
    copy.channel.instruct(copy.notice, Instruction(Kind.BECOME, 2, slot=1), TOKEN)
    if move == "clone":
        worker.channel.instruct(parked.notice, CONTINUE, TOKEN)
    donor_lines, donor_status = output(worker.process)
    copy_lines, copy_status = output(copy.process)
    assert copy_status == 0 and copy_lines[0] == "instruction become 1"
    assert _steps(copy_lines) == reference[5:], "losses equal the reference run's exactly"
    if move == "clone":
        assert donor_status == 0 and _steps(donor_lines) == reference
    else:
        assert donor_status == -signal.SIGKILL, "CRIU kills a migrated worker once dumped"
        assert _steps(donor_lines) == reference[:5]


def test_launcher_death_kills_its_clones(tmp_path: Path) -> None:
    require_criu()
    launcher = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "park_launcher.py"), str(tmp_path)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,
    )
    try:
        assert launcher.stdout is not None
        pids = json.loads(launcher.stdout.readline())
        assert not procs.gone(pids["donor"]) and not procs.gone(pids["clone"])
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 60  # a safety net: the kernel kills them at once
        while not (procs.gone(pids["donor"]) and procs.gone(pids["clone"])):
            assert time.monotonic() < deadline, f"outlived their launcher: {pids}"
            time.sleep(0.05)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def test_a_copy_is_copied_again_and_moved(tmp_path: Path) -> None:
    """A copy runs in a PID namespace of its own, like the original: it can be a donor (a clone
    of a clone) and be migrated, each copy going on exactly where its source parked."""
    require_criu()
    reference = _reference("park_toy.py", "9", "-1")
    worker = start_worker("park_toy.py", "9", "2,4,6")
    parked = worker.park()
    first = cloner.clone(parked, tmp_path)  # at step 2
    first.channel.instruct(first.notice, Instruction(Kind.BECOME, 2, slot=1), TOKEN)
    worker.channel.instruct(parked.notice, CONTINUE, TOKEN)
    for _step in (4, 6):  # the original parks there too, and just goes on
        worker.channel.instruct(worker.channel.wait_parked(TOKEN), CONTINUE, TOKEN)
    parked = _parked(first)  # at step 4: the copy is the donor
    second = cloner.clone(parked, tmp_path)
    second.channel.instruct(second.notice, Instruction(Kind.BECOME, 3, slot=2), TOKEN)
    first.channel.instruct(parked.notice, CONTINUE, TOKEN)
    moved = cloner.migrate(_parked(first), tmp_path)  # at step 6: the copy moves
    moved.channel.instruct(moved.notice, CONTINUE, TOKEN)
    second.channel.instruct(second.channel.wait_parked(TOKEN), CONTINUE, TOKEN)  # at 6
    first_lines, first_status = output(first.process)
    second_lines, second_status = output(second.process)
    moved_lines, moved_status = output(moved.process)
    worker_lines, worker_status = output(worker.process)
    assert _steps(worker_lines) == reference and worker_status == 0
    assert first_lines[0] == "instruction become 1" and first_status == -signal.SIGKILL
    assert _steps(first_lines) == reference[2:6]
    assert second_lines[:2] == ["instruction become 2", reference[4]]
    assert _steps(second_lines) == reference[4:] and second_status == 2
    assert moved_lines[0] == "instruction continue 1"
    assert _steps(moved_lines) == reference[6:] and moved_status == 1


def _parked(copy: cloner.Clone) -> cloner.Parked:
    """A copy parked again (it told its channel so): ready to be copied."""
    return cloner.Parked(copy.process.pid, copy.channel, copy.channel.wait_parked(TOKEN))


def test_a_failed_dump_is_one_line_and_leaves_the_process_running(tmp_path: Path) -> None:
    """A process holding a TCP connection cannot be dumped (no --tcp-established: the hook
    closes every socket before it parks): one line naming CRIU's log, the process untouched."""
    require_criu()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_CONNECTION, str(port)],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            peer, _ = server.accept()
            with pytest.raises(criu.DumpFailed) as failed:
                criu.dump(holder.pid, tmp_path / "images", leave_running=True)
            message = str(failed.value)
            assert "\n" not in message and message.endswith(f"log: {failed.value.log}")
            assert "TCP" in message and failed.value.log.exists()
            peer.sendall(b"x")  # still running: it answers
            assert holder.stdout is not None and holder.stdout.readline() == b"alive\n"
            peer.close()
        finally:
            holder.kill()
            holder.wait()


HOLD_CONNECTION = """
import socket, sys
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
conn.recv(1)
print("alive", flush=True)
"""
