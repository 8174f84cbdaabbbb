"""The node agent's side: poll the health sources every few seconds, hand the readings on.

:class:`HealthPoller` runs one daemon thread that calls every enabled source's ``read()`` each
``interval`` seconds (default 5) and gives the poll's readings, all sources together, to
``deliver`` (the agent sends them to the controller, where :func:`torchrelay.health.judge.judge`
folds them in). A source whose ``read`` raises is disabled with ONE log line and the others go
on: a broken driver costs the job its health readings, never its training. An exception from
``deliver`` is logged and stops the poller (a bug on the caller's side, said loudly once).
:meth:`HealthPoller.stop` wakes the thread at once, joins it and closes the sources.

:func:`node_sources` builds a node's sources: NVML (disabled by itself where there is no
NVIDIA GPU) and the run directory's injection file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from torchrelay.health.inject import InjectionSource
from torchrelay.health.log import Log, log_stderr
from torchrelay.health.nvml import NvmlSource
from torchrelay.health.readings import Reading

DEFAULT_INTERVAL = 5.0


class HealthSource(Protocol):
    """A source of readings: ``read`` returns this poll's readings (``[]``: nothing to say)."""

    name: str

    def read(self) -> list[Reading]: ...


def node_sources(
    run_dir: Path, node: str, locate: Callable[[str], int | None], log: Log = log_stderr
) -> list[HealthSource]:
    """The sources of ``node``: NVML and ``run_dir``'s injection file (``locate`` maps a
    process of the node to its device index)."""
    return [NvmlSource(node, log=log), InjectionSource(run_dir, node, locate, log=log)]


class HealthPoller:
    """Polls ``sources`` every ``interval`` seconds on a thread (see the module docstring)."""

    def __init__(
        self,
        sources: Sequence[HealthSource],
        deliver: Callable[[list[Reading]], None],
        interval: float = DEFAULT_INTERVAL,
        log: Log = log_stderr,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"health poll interval {interval!r} is not a positive duration")
        self.sources = list(sources)  # the enabled ones; a failing source leaves the list
        self._deliver = deliver
        self._interval = interval
        self._log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-poller", daemon=True)

    def poll_once(self) -> list[Reading]:
        """Read every enabled source once, deliver the readings and return them."""
        readings: list[Reading] = []
        for source in list(self.sources):
            try:
                readings.extend(source.read())
            except Exception as exc:  # any failure of a source: disable it, keep the others
                self.sources.remove(source)
                self._log(f"{source.name} source disabled: {type(exc).__name__}: {exc}")
                _close(source)
        self._deliver(readings)
        return readings

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop polling (a poll under way finishes first) and close the sources."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for source in self.sources:
            _close(source)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # from deliver: the caller's bug, said once
                self._log(f"health poller stopped: delivering readings failed: {exc!r}")
                return
            self._stop.wait(self._interval)


def _close(source: HealthSource) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        close()
