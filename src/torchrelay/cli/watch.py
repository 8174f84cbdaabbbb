"""``torchrelay status RUN_DIR [--watch]``: a running job's view, once or live.

The view (:mod:`torchrelay.cli.status_view`) comes from the controller's status RPC and the tail
of the run directory's ledger, read incrementally (:class:`LedgerTail`). ``--watch`` redraws it
every ``--interval`` seconds with ``rich.live.Live`` until the job ends -- its ledger records
``job_end`` or its controller stops answering -- or Ctrl-C; both exit 0 with one line.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live

from torchrelay.cli.status_view import RECENT, StepRate, render
from torchrelay.events import Event, JobEnd, parse_event
from torchrelay.ledger import LedgerError

if TYPE_CHECKING:
    from torchrelay.control.client import ControlClient


class LedgerTail:
    """The last ``keep`` events of a ledger that is being written, read from where the last
    :meth:`poll` stopped; a torn last line waits for the next poll, malformed lines and events
    this version does not know are skipped."""

    def __init__(self, path: Path, keep: int = RECENT) -> None:
        self.path = path
        self.recent: deque[Event] = deque(maxlen=keep)
        self.ended: JobEnd | None = None
        self._offset = 0

    def poll(self) -> None:
        try:
            with self.path.open("rb") as ledger:
                ledger.seek(self._offset)
                data = ledger.read()
        except OSError:  # not there (yet), or not readable here: no events to show
            return
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        for line in data[:complete].splitlines():
            event = _parse(line)
            if event is not None:
                self.recent.append(event)
                if isinstance(event, JobEnd):
                    self.ended = event


def _parse(line: bytes) -> Event | None:
    try:
        entry = json.loads(line)
        return parse_event(entry) if isinstance(entry, dict) else None
    except (ValueError, RecursionError, LedgerError):
        return None


def show(
    client: ControlClient, run_dir: Path, status: dict[str, Any], watch: bool, interval: float
) -> int:
    """Print the view of ``status``; with ``watch``, keep redrawing it until the job ends."""
    from torchrelay.control.client import ControlError  # loaded by connect()

    tail, rate = LedgerTail(run_dir / "ledger.jsonl"), StepRate()
    title = f"torchrelay {run_dir}"
    console = Console()
    tail.poll()
    rate.add(time.monotonic(), status["steps_committed"])
    view = render(status, list(tail.recent), None, title)
    if not watch:
        console.print(view)
        return 0
    # Ctrl-C only sets a flag: an exception raised wherever the signal lands (inside a gRPC
    # call, while the view is drawn) could escape as a traceback.
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        with Live(view, console=console, auto_refresh=False) as live:
            while tail.ended is None and not interrupted.wait(interval):
                tail.poll()
                try:
                    status = client.status(timeout=5.0)
                except ControlError:
                    break
                rate.add(time.monotonic(), status["steps_committed"])
                live.update(render(status, list(tail.recent), rate.rate(), title), refresh=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        _say(console, "torchrelay: stopped watching; the job goes on")
        return 0
    tail.poll()
    _say(console, _ended(tail.ended, run_dir))
    return 0


def _say(console: Console, line: str) -> None:
    """``line`` under the last view, unwrapped (a pipe gets the view without its last newline)."""
    if not console.is_terminal:
        console.line()
    print(line, flush=True)


def _ended(end: JobEnd | None, run_dir: Path) -> str:
    if end is None:
        what = "the job's controller stopped answering: the job ended or its launcher died"
    else:
        what = f"the job ended: {end.status}, {end.steps_committed} steps committed"
    return f"torchrelay: {what}; see `torchrelay report {run_dir}`"
