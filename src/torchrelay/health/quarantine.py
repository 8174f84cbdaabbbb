"""Quarantine: the devices judged unhealthy, never handed to a spare until an operator clears
them (``torchrelay uncordon``).

Plain data and pure functions: a :class:`Quarantine` is a set of :class:`Quarantined`
entries, one per ``(node, device)`` (``device`` None: the whole node), each with the reason
and the time it was judged. :func:`quarantined` adds one, :func:`cleared` removes one (raising
:class:`QuarantineError` for an entry that is not there), and :func:`usable` is what spare
placement consults: the devices of a list that are not quarantined.

The set persists in ``RUN_DIR/quarantine.json`` (:func:`load`, :func:`save`): an owner-only
file written atomically (:mod:`torchrelay.health.files`), so the controller that adds entries
and the operator who clears them each read a whole file; :func:`update` does a
read-change-write under an exclusive lock on ``RUN_DIR/quarantine.lock`` so that neither
loses the other's change. A file that is malformed or not the user's own raises
:class:`QuarantineError` with one line.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from torchrelay.health.files import UntrustedFile, read_owned, write_atomic
from torchrelay.health.log import log_stderr
from torchrelay.typed import Plain, at_least

FILE = "quarantine.json"
LOCK = "quarantine.lock"
Device = tuple[str, int]  # (node, device index)


class QuarantineError(ValueError):
    """The quarantine cannot be read or changed as asked; the message says why, in one line."""


@dataclass(frozen=True, kw_only=True)
class Quarantined(Plain):
    """``node``'s ``device`` (None: every device of the node) is unhealthy since ``t``."""

    ERROR: ClassVar[type[Exception]] = QuarantineError

    node: str
    device: int | None = at_least(0, "a device index (an integer >= 0) or null", default=None)
    reason: str
    t: float

    def covers(self, node: str, device: int) -> bool:
        return self.node == node and self.device in (None, device)

    def where(self) -> str:
        return self.node if self.device is None else f"{self.node} device {self.device}"


@dataclass(frozen=True)
class Quarantine:
    entries: tuple[Quarantined, ...] = ()

    def holds(self, node: str, device: int) -> bool:
        return any(entry.covers(node, device) for entry in self.entries)


def quarantined(quarantine: Quarantine, entry: Quarantined) -> Quarantine:
    """``quarantine`` with ``entry`` (replacing an entry for the same node and device)."""
    kept = [e for e in quarantine.entries if (e.node, e.device) != (entry.node, entry.device)]
    return Quarantine((*kept, entry))


def cleared(quarantine: Quarantine, node: str, device: int | None) -> Quarantine:
    """``quarantine`` without the entry for ``node``'s ``device`` (None: the node's entry)."""
    kept = tuple(e for e in quarantine.entries if (e.node, e.device) != (node, device))
    if len(kept) == len(quarantine.entries):
        what = node if device is None else f"{node} device {device}"
        held = ", ".join(e.where() for e in quarantine.entries) or "nothing"
        raise QuarantineError(f"{what} is not quarantined (quarantined: {held})")
    return Quarantine(kept)


def usable(devices: Iterable[Device], quarantine: Quarantine) -> list[Device]:
    """The ``(node, device)`` pairs of ``devices``, in order, that are not quarantined."""
    return [(node, device) for node, device in devices if not quarantine.holds(node, device)]


def devices_of(run_dir: Path, node: str) -> frozenset[int]:
    """The quarantined devices of ``node`` (a whole-node entry is left to the scheduler); an
    unreadable quarantine holds none back, and says so on stderr."""
    try:
        entries = load(run_dir).entries
    except QuarantineError as exc:
        log_stderr(f"quarantine not applied: {exc}")
        return frozenset()
    return frozenset(e.device for e in entries if e.node == node and e.device is not None)


def load(run_dir: Path) -> Quarantine:
    """The quarantine of the job in ``run_dir`` (empty if it has none yet)."""
    path = run_dir / FILE
    try:
        plain = json.loads(read_owned(path))
    except FileNotFoundError:
        return Quarantine()
    except (OSError, UntrustedFile, json.JSONDecodeError) as exc:
        raise QuarantineError(f"cannot read {path}: {exc}") from None
    if not isinstance(plain, list):
        raise QuarantineError(f"{path}: expected a JSON list of entries")
    try:
        return Quarantine(tuple(Quarantined.from_plain(entry) for entry in plain))
    except QuarantineError as exc:
        raise QuarantineError(f"{path}: {exc}") from None


def save(run_dir: Path, quarantine: Quarantine) -> None:
    write_atomic(run_dir / FILE, [entry.to_plain() for entry in quarantine.entries])


def update(run_dir: Path, change: Callable[[Quarantine], Quarantine]) -> Quarantine:
    """Apply ``change`` to the persisted quarantine under the lock; the new quarantine.
    What ``change`` raises is raised with nothing written."""
    fd = os.open(run_dir / LOCK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        new = change(load(run_dir))
        save(run_dir, new)
        return new
    finally:
        os.close(fd)  # and with it the lock
