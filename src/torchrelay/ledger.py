"""The event ledger: an append-only JSONL file per job, and its reader.

Every line is one event ``{"t": <unix seconds>, "event": <name>, ...}``. Writes are flushed
line by line so a crash of the launcher loses at most the line being written. The events a
post-mortem rests on (:data:`DURABLE_EVENTS`: how the job ended, each failure, each finished
recovery) are also fsynced, so they survive a crash of the host, not only of the process;
the frequent ones (progress, heartbeat-driven events) are not, to keep the ledger cheap.

The fsync runs on a thread of the ledger's own, never in the writer: the controller records a
failure under its lock before it aborts the survivors, and an fsync takes 0.1 ms on an idle
local disk, 4-10 ms at p90-p99 on this VM beside a test suite, and more on a network file
system -- all of it added to every survivor's stall. A durable event is on the disk
milliseconds after it is written, and :meth:`Ledger.close` returns only once every one is.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, TextIO

DURABLE_EVENTS = frozenset({"job_end", "failure", "recovery_done"})
"""Events written through to the disk (``os.fsync``), by :meth:`Ledger.close` at the latest."""


class LedgerError(ValueError):
    """A ledger file that cannot be read as a torchrelay ledger; the message says why."""


class Ledger:
    """Thread-safe appender for ``RUN_DIR/ledger.jsonl``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._durable_written = 0  # durable lines written, and of them fsynced
        self._durable_synced = 0
        self._syncer: threading.Thread | None = None
        self._closing = False

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event; it is flushed, and fsynced if it is one of DURABLE_EVENTS."""
        return self.write({"t": fields.pop("t", time.time()), "event": event, **fields})

    def write(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Append one line ``entry`` (``{"t": ..., "event": ..., ...}``, a typed event's
        ``to_json()``); flushed, and fsynced soon after if its event is one of
        DURABLE_EVENTS (see the module doc). Never waits for the disk."""
        with self._lock:
            self._file.write(json.dumps(entry, sort_keys=False) + "\n")
            self._file.flush()
            if entry["event"] in DURABLE_EVENTS:
                self._durable_written += 1
                if self._syncer is None:
                    self._syncer = threading.Thread(
                        target=self._sync_loop, name="torchrelay-ledger-sync", daemon=True
                    )
                    self._syncer.start()
                self._wake.notify()
        return entry

    def close(self) -> None:
        """Close the file once every durable line written is on the disk."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        if self._syncer is not None:
            self._syncer.join()  # its fsync must end before the descriptor is closed
        with self._lock:
            if self._durable_synced < self._durable_written:
                os.fsync(self._file.fileno())
                self._durable_synced = self._durable_written
            self._file.close()

    def _sync_loop(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(
                    lambda: self._closing or self._durable_synced < self._durable_written
                )
                if self._closing:
                    return  # close() syncs what is left
                target, fd = self._durable_written, self._file.fileno()
            os.fsync(fd)  # without the lock: writers go on meanwhile
            with self._lock:
                self._durable_synced = target


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """All events of a ledger file, in order; a torn last line (crash mid-write) is skipped.

    Lines that are not event objects (a torn write, a stray line) are skipped. Raises
    :class:`LedgerError` if ``path`` is not a ledger at all: not a readable file, not UTF-8
    text, or lines of which not one is an event.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise LedgerError(f"{path} is a directory, not a ledger file") from None
    except UnicodeDecodeError:
        raise LedgerError(f"{path} is not a torchrelay ledger (not UTF-8 text)") from None
    except OSError as exc:
        raise LedgerError(f"cannot read {path}: {exc.strerror}") from None
    events = []
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("event"), str):
            events.append(entry)
    if lines and not events:
        raise LedgerError(
            f"{path} is not a torchrelay ledger (no line is a JSON object with an 'event')"
        )
    return events
