"""The controller's ledger as ``python -m bench.control`` follows it: what it records that makes
a scale no longer a fair measurement (hangs declared, nodes lost, the job's end)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class LedgerTail:
    """The controller's ledger as it grows: events are read, never written, by the bench."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._checked = 0  # events already judged by trouble()
        self._trouble: str | None = None

    def poll(self) -> None:
        try:
            with self.path.open("rb") as ledger:
                ledger.seek(self._offset)
                data = ledger.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        self.events += [json.loads(line) for line in complete.splitlines()]

    def trouble(self) -> str | None:
        """Why the job is no longer a fair measurement: the controller saw hangs, lost nodes
        or ended the job (what heartbeats that cannot get through lead to)."""
        self.poll()
        for event in self.events[self._checked :]:
            if self._trouble is None and event["event"] in (
                "hang_detected",
                "node_lost",
                "job_end",
            ):
                detail = event.get("reason") or event.get("status") or ""
                self._trouble = f"controller ledger: {event['event']} {detail}".strip()
        self._checked = len(self.events)
        return self._trouble

    async def until(self, done: Callable[[], bool], timeout: float) -> None:
        """Wait until ``done()``; raise :class:`Stopped` as soon as :meth:`trouble` says why it
        may never be, ``TimeoutError`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not done():
            trouble = self.trouble()
            if trouble is not None:
                raise Stopped(trouble)
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done in {timeout:.0f} s")
            await asyncio.sleep(0.02)


class Stopped(Exception):
    """The controller cannot keep up (see :meth:`LedgerTail.trouble`)."""
