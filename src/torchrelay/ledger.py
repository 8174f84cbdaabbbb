"""The event ledger: an append-only JSONL file per job, and its reader.

Every line is one event ``{"t": <unix seconds>, "event": <name>, ...}``. Writes are flushed
line by line so a crash of the launcher loses at most the line being written. The events a
post-mortem rests on (:data:`DURABLE_EVENTS`: how the job ended, each failure, each finished
recovery) are also fsynced, so they survive a crash of the host, not only of the process;
the frequent ones (progress, heartbeat-driven events) are not, to keep the ledger cheap.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, TextIO

DURABLE_EVENTS = frozenset({"job_end", "failure", "recovery_done"})
"""Events written through to the disk (``os.fsync``) before :meth:`Ledger.record` returns."""


class LedgerError(ValueError):
    """A ledger file that cannot be read as a torchrelay ledger; the message says why."""


class Ledger:
    """Thread-safe appender for ``RUN_DIR/ledger.jsonl``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event; it is flushed, and fsynced if it is one of DURABLE_EVENTS."""
        return self.write({"t": fields.pop("t", time.time()), "event": event, **fields})

    def write(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Append one line ``entry`` (``{"t": ..., "event": ..., ...}``, a typed event's
        ``to_json()``); flushed, and fsynced if its event is one of DURABLE_EVENTS."""
        with self._lock:
            self._file.write(json.dumps(entry, sort_keys=False) + "\n")
            self._file.flush()
            if entry["event"] in DURABLE_EVENTS:
                os.fsync(self._file.fileno())
        return entry

    def close(self) -> None:
        with self._lock:
            self._file.close()


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
