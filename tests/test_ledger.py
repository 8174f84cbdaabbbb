"""The ledger: the events a post-mortem rests on reach the disk; garbage is refused clearly."""

from __future__ import annotations

import json
import os

import pytest

from torchrelay import ledger as ledger_module
from torchrelay.ledger import DURABLE_EVENTS, Ledger, LedgerError, read_ledger


def test_job_end_failures_and_recoveries_are_fsynced_and_nothing_else(tmp_path, monkeypatch):
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        ledger_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1]
    )
    book = Ledger(tmp_path / "ledger.jsonl")
    for event in ("job_start", "process_join", "progress", "chaos_fired", "hang_detected"):
        book.record(event)
    assert synced == []  # frequent events stay cheap
    for count, event in enumerate(("failure", "recovery_done", "job_end"), 1):
        book.record(event)
        assert len(synced) == count, f"{event} was not fsynced"
    book.close()
    assert {"failure", "recovery_done", "job_end"} == DURABLE_EVENTS
    assert [e["event"] for e in read_ledger(tmp_path / "ledger.jsonl")][-1] == "job_end"


def test_a_torn_last_line_and_stray_lines_are_skipped(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps({"t": 1.0, "event": "job_start"}) + '\n[1]\n{"t": 2.0, "ev')
    assert [e["event"] for e in read_ledger(path)] == ["job_start"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"[1, 2, 3]\n", "no line is a JSON object"),
        (b"hello\nworld\n", "no line is a JSON object"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b'{"t": 1}\n', "no line is a JSON object"),
    ],
    ids=["array", "garbage", "binary", "object-without-event"],
)
def test_what_is_not_a_ledger_is_refused_with_the_reason(tmp_path, content, why):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(content)
    with pytest.raises(LedgerError, match=why):
        read_ledger(path)


def test_a_directory_in_place_of_the_ledger_is_refused(tmp_path):
    (tmp_path / "ledger.jsonl").mkdir()
    with pytest.raises(LedgerError, match="is a directory"):
        read_ledger(tmp_path / "ledger.jsonl")
