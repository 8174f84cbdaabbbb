"""The injection health source: readings a drill or a test raises on purpose.

A node's injected readings live in ``RUN_DIR/health/<node>.json``: one JSON object, or a list
of them, each naming its target by ``device`` (a local index) or by ``process`` (a worker or
spare name; the node agent maps it to the device it holds, so the injection follows the
process, not the GPU) and giving any measurement of :class:`Reading`, e.g.::

    [{"process": "worker2", "slot": 2, "temperature_c": 95}]

:class:`InjectionSource` returns those readings at every poll while the file is there (delete
it to end the drill). The file is trusted only if it is this user's own, owner-only regular
file (:mod:`torchrelay.health.files`): what it says is acted on. A missing file is no
injection; a malformed or untrusted one is ignored after ONE log line (one per distinct
problem, not one per poll), never a crash. :func:`inject` writes an entry atomically (what
``torchrelay chaos overheat`` does), replacing an earlier entry for the same target.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from torchrelay.health.files import UntrustedFile, read_owned, write_atomic
from torchrelay.health.log import Log, log_stderr
from torchrelay.health.readings import Reading, ReadingError, Source

DIRECTORY = "health"
# What an entry may say: a Reading's fields but those the source fills in.
ENTRY_KEYS = tuple(f.name for f in fields(Reading) if f.name not in ("node", "source", "t"))


class InjectionError(ValueError):
    """An injection file or entry that cannot be used; the message says why, in one line."""


def injection_path(run_dir: Path, node: str) -> Path:
    return run_dir / DIRECTORY / f"{node}.json"


def parse_entries(text: str, node: str) -> list[dict[str, Any]]:
    """The entries of an injection file's ``text``, each checked; raises
    :class:`InjectionError` with one line."""
    try:
        plain = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InjectionError(f"not JSON ({exc})") from None
    entries = plain if isinstance(plain, list) else [plain]
    for entry in entries:
        check_entry(entry, node)
    return entries


def check_entry(entry: Any, node: str) -> None:
    """Raise :class:`InjectionError` unless ``entry`` is a usable injection for ``node``."""
    if not isinstance(entry, dict):
        raise InjectionError(f"an entry is {type(entry).__name__}, not a JSON object")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise InjectionError(f"unknown key {unknown[0]!r} (known: {', '.join(ENTRY_KEYS)})")
    if entry.get("device") is None and entry.get("process") is None:
        raise InjectionError("an entry names neither a device nor a process")
    try:
        device = entry.get("device")
        _reading(entry, node, 0 if device is None else device, 0.0)
    except ReadingError as exc:
        raise InjectionError(str(exc).removeprefix("Reading: ")) from None


def _reading(entry: dict[str, Any], node: str, device: Any, t: float) -> Reading:
    plain = {**entry, "node": node, "source": Source.INJECTED.value, "t": t, "device": device}
    return Reading.from_wire(plain)


def inject(run_dir: Path, node: str, entry: dict[str, Any]) -> Path:
    """Add ``entry`` to ``node``'s injection file (replacing one for the same target), in one
    atomic write; the file's path. Raises :class:`InjectionError` for a bad entry, or for an
    existing file it cannot trust or parse (delete it first)."""
    check_entry(entry, node)
    path = injection_path(run_dir, node)
    try:
        entries = parse_entries(read_owned(path), node)
    except FileNotFoundError:
        entries = []
    except (UntrustedFile, OSError, InjectionError) as exc:
        raise InjectionError(f"cannot add to {path}: {exc}") from None
    target = (entry.get("device"), entry.get("process"))
    kept = [e for e in entries if (e.get("device"), e.get("process")) != target]
    write_atomic(path, [*kept, entry])
    return path


class InjectionSource:
    """Injected readings of ``node`` from ``run_dir`` (see the module docstring).

    ``locate(process)`` is the local device index a process of this node holds (None: no such
    live process); without it, entries naming a process are skipped.
    """

    name = "injected"

    def __init__(
        self,
        run_dir: Path,
        node: str,
        locate: Callable[[str], int | None] | None = None,
        log: Log = log_stderr,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.path = injection_path(run_dir, node)
        self._locate = locate
        self._log = log
        self._clock = clock
        self._said: set[str] = set()  # the problems logged since the file was last absent

    def read(self) -> list[Reading]:
        """The injected readings now (``[]`` with no file, or a file that cannot be used)."""
        try:
            entries = parse_entries(read_owned(self.path), self.node)
        except FileNotFoundError:
            self._said.clear()
            return []
        except (UntrustedFile, OSError, InjectionError) as exc:
            self._complain(f"injection file {self.path} ignored: {exc}")
            return []
        t = self._clock()
        readings = []
        for entry in entries:
            device = entry.get("device")
            process = entry.get("process")
            if device is None and process is not None and self._locate is not None:
                device = self._locate(process)
            if device is None:
                self._complain(f"injection for {process} ignored: no such process on {self.node}")
                continue
            readings.append(_reading(entry, self.node, device, t))
        return readings

    def _complain(self, line: str) -> None:
        if line not in self._said:
            self._log(line)
            self._said.add(line)
