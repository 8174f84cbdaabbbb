"""The ledger: the events a post-mortem rests on reach the disk; garbage is refused clearly."""

from __future__ import annotations

import json
import os
import threading

import pytest

from torchrelay import ledger as ledger_module
from torchrelay.ledger import DURABLE_EVENTS, Ledger, LedgerError, read_ledger


def test_job_end_failures_and_recoveries_are_fsynced_and_nothing_else(tmp_path, monkeypatch):
    synced = threading.Semaphore(0)
    real_fsync = os.fsync
    monkeypatch.setattr(ledger_module.os, "fsync", lambda fd: (real_fsync(fd), synced.release()))
    book = Ledger(tmp_path / "frequent.jsonl")
    for event in ("job_start", "process_join", "progress", "chaos_fired", "hang_detected"):
        book.record(event)
    book.close()
    assert not synced.acquire(blocking=False)  # frequent events stay cheap
    book = Ledger(tmp_path / "ledger.jsonl")
    for event in ("failure", "recovery_done", "job_end"):
        book.record(event)
        assert synced.acquire(timeout=60), f"{event} was not fsynced"
    book.close()
    assert {"failure", "recovery_done", "job_end"} == DURABLE_EVENTS
    assert [e["event"] for e in read_ledger(tmp_path / "ledger.jsonl")][-1] == "job_end"


def test_a_durable_event_never_waits_for_the_disk_and_close_waits_for_it(tmp_path, monkeypatch):
    """The controller records a failure before it aborts the survivors: a slow fsync (a busy
    or network disk) must not delay the abort. Closing still waits for the disk."""
    entered, disk = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        entered.set()
        disk.wait()
        real_fsync(fd)

    monkeypatch.setattr(ledger_module.os, "fsync", slow_fsync)
    book = Ledger(tmp_path / "ledger.jsonl")

    def writes():
        book.record("failure", process="worker1")
        assert entered.wait(timeout=60)  # the fsync is under way, and stuck...
        book.record("recovery_start")  # ...while the writer goes on
        book.record("recovery_done")

    writer = threading.Thread(target=writes)
    writer.start()
    try:
        writer.join(timeout=60)  # a failsafe: the writes end at once unless they wait
        assert not writer.is_alive(), "a writer waited for the disk"
        closer = threading.Thread(target=book.close)
        closer.start()
        closer.join(timeout=0.2)
        assert closer.is_alive()  # closing waits for the disk
    finally:
        disk.set()
    closer.join(timeout=60)
    assert not closer.is_alive()
    events = [e["event"] for e in read_ledger(tmp_path / "ledger.jsonl")]
    assert events == ["failure", "recovery_start", "recovery_done"]


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
