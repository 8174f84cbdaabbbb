"""SIGTERM and SIGINT to a launcher: what a scheduler (Slurm, Kubernetes) or a Ctrl-C sends to
ask a job to stop. The launcher catches them, stops its workers and spares in order and exits
``128 + N``, as a process killed by signal N would report to a shell (143 for SIGTERM, 130
for SIGINT)."""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A scheduler may signal every process of the job at once (Slurm's scancel does): a worker
# killed by SIGTERM is part of that stop, not a failure, if the launcher's own signal follows
# within this many seconds. A worker SIGTERMed alone is detected this much later.
ALONGSIDE = 2.0


class StopSignals:
    """While entered (on the main thread), SIGTERM and SIGINT only set :attr:`received`.

    The handler takes no lock and does nothing else: it runs on the main thread between any
    two bytecodes, possibly while that thread holds a lock it would need. The main thread
    polls :attr:`received` and does the stopping itself. Entered from another thread (a test
    driving a launcher in-process), it does nothing: Python handles signals on the main
    thread only.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._catch) for s in STOP_SIGNALS}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _catch(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum

    def follows(self, timeout: float) -> bool:
        """Whether a stop signal has arrived, or arrives within ``timeout`` seconds (polled:
        the handler cannot notify anyone)."""
        deadline = time.monotonic() + timeout
        while self.received is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.received is not None

    @property
    def name(self) -> str:
        """The received signal's name (``SIGTERM``); only once :attr:`received` is set."""
        assert self.received is not None
        return signal.Signals(self.received).name


def exit_status(signal_name: str) -> int:
    """The launcher's exit status after stopping the job on ``signal_name``: 128 + N."""
    return 128 + int(signal.Signals[signal_name])
