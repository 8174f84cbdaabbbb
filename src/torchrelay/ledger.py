"""The event ledger: an append-only JSONL file per job, and its reader.

Every line is one event ``{"t": <unix seconds>, "event": <name>, ...}``. Writes are flushed
line by line so a crash of the launcher loses at most the line being written.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, TextIO


class Ledger:
    """Thread-safe appender for ``RUN_DIR/ledger.jsonl``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        entry = {"t": fields.pop("t", time.time()), "event": event, **fields}
        with self._lock:
            self._file.write(json.dumps(entry, sort_keys=False) + "\n")
            self._file.flush()
        return entry

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """All events of a ledger file, in order; a torn last line (crash mid-write) is skipped."""
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
