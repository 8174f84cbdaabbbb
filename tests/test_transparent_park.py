"""The park protocol over real pipes (no CRIU): a worker parks, obeys only a sealed instruction
answering its own park, and leaves on a closed channel; a missing CRIU is one line."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.snapshots import TOKEN, output, start_worker
from torchrelay.control.wire import seal
from torchrelay.transparent import criu
from torchrelay.transparent.park import Instruction, Kind, ParkError


def test_parked_worker_continues_on_its_instruction() -> None:
    worker = start_worker("park_toy.py", "4", "2", own_pid_namespace=False)
    parked = worker.park()
    assert parked.notice.pid == worker.process.pid
    worker.channel.instruct(parked.notice, Instruction(Kind.CONTINUE, generation=1), TOKEN)
    lines, status = output(worker.process)
    assert lines[2] == "instruction continue None"
    assert [line.split()[1] for line in lines if line.startswith("step")] == ["0", "1", "2", "3"]
    assert status == 0


def _another_park(nonce: str) -> bytes:
    return seal(Instruction(Kind.BECOME, 1, slot=5).to_wire("another-park"), TOKEN)


@pytest.mark.parametrize(
    ("answer", "refusal"),
    [
        (lambda nonce: seal({"kind": "become", "reply_to": nonce}, "x"), "wrong job token"),
        (_another_park, "answers another park"),
        (lambda nonce: seal({"reply_to": nonce, "kind": "x"}, TOKEN), "malformed park"),
        (None, "park channel closed"),
    ],
    ids=["forged", "another-park", "malformed", "agent-gone"],
)
def test_worker_refuses_what_is_not_its_instruction(answer, refusal: str) -> None:
    worker = start_worker("park_toy.py", "4", "1", own_pid_namespace=False)
    parked = worker.park()
    if answer is None:
        worker.channel.close()
    else:
        line = answer(parked.notice.nonce) + b"\n"
        with open(worker.channel.instructions, "wb", closefd=False) as pipe:
            pipe.write(line)
    lines, status = output(worker.process)
    assert status != 0
    assert not any(line.startswith("instruction") for line in lines)
    assert lines[-1].startswith("torchrelay.transparent.park.ParkError: ")
    assert refusal in lines[-1]
    worker.channel.close()


def test_malformed_instruction_body_is_one_line() -> None:
    with pytest.raises(ParkError, match="malformed park instruction"):
        Instruction.from_wire({"kind": "become", "generation": "x"})
    body = Instruction(Kind.BECOME, 3, slot=2, store="h:1", env={"RANK": "2"}).to_wire("n")
    assert Instruction.from_wire(body) == Instruction(
        Kind.BECOME, 3, slot=2, store="h:1", env={"RANK": "2"}
    )


def test_missing_or_old_criu_is_one_actionable_line(tmp_path: Path, monkeypatch) -> None:
    old = tmp_path / "criu"
    old.write_text("#!/bin/sh\necho 'Version: 3.17.1'\n")
    old.chmod(old.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(criu, "_candidates", lambda: [str(tmp_path / "none"), str(old)])
    criu.find_criu.cache_clear()
    try:
        with pytest.raises(criu.CriuUnavailable) as caught:
            criu.find_criu()
    finally:
        criu.find_criu.cache_clear()
    message = str(caught.value)
    assert "\n" not in message
    assert "older than 4.1" in message and "No such file" in message
    assert message.endswith(
        "run scripts/setup_criu.sh (it builds CRIU 4.1.1 into .venv/criu) or set TORCHRELAY_CRIU"
    )
