"""What of a process's output the launcher's console shows, and under which prefix.

Every line a worker or spare writes (stdout and stderr, one stream) goes to its log,
``RUN_DIR/logs/<process>.log``, whatever is shown. The console shows it with a prefix naming
the rank the process serves: ``[rank2]``, ``[rank2<spare0]`` once a spare has taken slot 2,
``[spare0]`` while it waits. torchrun's ``--local-ranks-filter`` and ``--redirects`` choose
local ranks (a slot's index among its node's, ``slot % nproc_per_node``) whose output stays
off the console; a spare is shown as the slot it took, and not before it took one. Under such a
filter a spare's lines wait (the last :data:`HELD_LINES`) until it is known whether its slot is
shown: on a node other than the controller's, a replacement's first lines can come before the
``seated`` notice that names its slot.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

WORKER = "worker"
HELD_LINES = 1000


def worker_slot(process: str) -> int | None:
    """The slot a worker was started for (``worker3``: 3); ``None`` for a spare."""
    index = process.removeprefix(WORKER)
    return int(index) if index != process and index.isdigit() else None


def prefix(process: str, slot: int | None) -> str:
    """The console prefix of ``process`` serving ``slot`` (``None``: none yet)."""
    own = worker_slot(process)
    if slot is None or slot == own:
        return process if own is None else f"rank{own}"
    return f"rank{slot}<{process}"


def on_console(slot: int | None, nproc_per_node: int, shown: frozenset[int] | None) -> bool:
    """Whether the output of a process serving ``slot`` reaches the console: every process's
    where ``shown`` is ``None``, else only that of slots whose local rank is in it."""
    if shown is None:
        return True
    return slot is not None and slot % nproc_per_node in shown


class Seats:
    """The slots this node's spares took, as a node other than the controller's hears of them
    (``seated`` commands); thread-safe (one writer, readers see a whole dict)."""

    def __init__(self) -> None:
        self._slots: dict[str, int] = {}

    def take(self, process: str, slot: int) -> None:
        self._slots = {**self._slots, process: slot}

    def of(self, process: str) -> int | None:
        """The slot ``process`` serves: the one it took, else its own (a worker's)."""
        return self._slots.get(process, worker_slot(process))


class Console:
    """The launcher's stdout, shared by the pumps of every process of a node: a line is shown
    whole, with its prefix, if :func:`on_console` says so. Once the reader has left
    (``torchrelay run | head``) nothing more is shown, and nothing fails: the pumps must keep
    draining the processes' pipes into their logs, or the processes would block."""

    def __init__(
        self, nproc_per_node: int, shown: frozenset[int] | None, seat: Callable[[str], int | None]
    ) -> None:
        self._nproc_per_node, self._shown, self._seat = nproc_per_node, shown, seat
        self.lock = threading.Lock()  # whole lines, also for the agent's own messages
        self._closed = False
        self._held: dict[str, deque[bytes]] = {}

    def show(self, process: str, raw: bytes) -> None:
        """Show one line ``process`` wrote, if its slot's output is shown; hold it while a
        filter is on and ``process`` serves no slot yet (a spare)."""
        with self.lock:
            slot = self._seat(process)
            if slot is None and self._shown is not None:
                self._held.setdefault(process, deque(maxlen=HELD_LINES)).append(raw)
                return
            self._release(process, slot)
            if on_console(slot, self._nproc_per_node, self._shown):
                self._print(process, slot, raw)

    def release(self, process: str) -> None:
        """Show the lines held of ``process`` if the slot it now serves is shown, else drop
        them; at once as its slot becomes known (``seated``), else with its next line."""
        with self.lock:
            slot = self._seat(process)
            if slot is not None:
                self._release(process, slot)

    def ended(self, process: str) -> None:
        """``process``'s output has ended: what is held of it is shown as :meth:`release`
        would, or dropped if it never served a slot."""
        self.release(process)
        with self.lock:
            self._held.pop(process, None)

    def _release(self, process: str, slot: int | None) -> None:
        held = self._held.pop(process, ())
        if held and on_console(slot, self._nproc_per_node, self._shown):
            for raw in held:
                self._print(process, slot, raw)

    def _print(self, process: str, slot: int | None, raw: bytes) -> None:
        if self._closed:
            return
        line = raw.decode(errors="replace").rstrip("\n")
        try:
            print(f"[{prefix(process, slot)}]:{line}", flush=True)
        except OSError:
            self._closed = True
