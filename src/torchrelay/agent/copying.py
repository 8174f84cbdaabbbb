"""The node agent's transparent-mode calls: park, instruct, clone and migrate its processes
(see :mod:`torchrelay.agent.cloning` for the recoveries built on them).

A mixin of :class:`~torchrelay.agent.agent.NodeAgent`: it uses the agent's process table, its
park channels (one per process when ``config.transparent``) and its lock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from torchrelay.agent import cloning
from torchrelay.config import JobConfig
from torchrelay.control.actions import CloneReplica, MigrateWorker
from torchrelay.event_base import Event
from torchrelay.transparent import cloner, criu, nsinit
from torchrelay.transparent.park import Channel, Instruction, Notice

if TYPE_CHECKING:
    from torchrelay.agent.template import ForkedProcess


class Copying:
    """Transparent mode's part of the node agent."""

    config: JobConfig
    environment: dict[str, str]
    _lock: threading.Lock
    _procs: dict[str, subprocess.Popen[bytes] | ForkedProcess]
    _parks: dict[str, Channel]
    _notices: dict[str, Notice]
    _moving: dict[str, subprocess.Popen[bytes] | ForkedProcess]
    _on_exit: Callable[[str, int], None]

    # NodeAgent's: own a process (its output, exit, signals).
    _adopt: Callable[[str, subprocess.Popen[bytes] | ForkedProcess, Channel | None], None]

    def parked(self, process: str) -> Notice:
        """Block until ``process`` parks at a step boundary (transparent mode); raise
        :class:`~torchrelay.transparent.park.ParkError` if it exits first."""
        notice = self._parks[process].wait_parked(self._token())
        with self._lock:
            self._notices[process] = notice
        return notice

    def instruct(self, process: str, instruction: Instruction) -> None:
        """Release the parked ``process`` with ``instruction`` (it answers its last park)."""
        with self._lock:
            channel, notice = self._parks[process], self._notices.pop(process)
        channel.instruct(notice, instruction, self._token())

    def clone(self, donor: str, process: str) -> cloner.Clone:
        """Copy the parked ``donor`` into a new job process named ``process``, parked too:
        supervised, logged and prefixed like any other; release both with :meth:`instruct`.
        CRIU errors propagate with the donor untouched (still parked)."""
        copy = cloner.clone(self._parked_record(donor), self.config.run_dir)
        with self._lock:
            self._notices[process] = copy.notice
        self._adopt(process, copy.process, copy.channel)
        return copy

    def migrate(self, process: str) -> cloner.Migrated:
        """Move the parked ``process`` into a restored copy of itself, under the same name:
        the original's death is the move, not a failure. A failed dump leaves it parked; a
        failed restore reports its death like any other exit, then raises."""
        parked = self._parked_record(process)
        with self._lock:
            original = self._procs[process]
            # Its supervisor skips the exit of this Popen (see _supervise); kept afterwards.
            self._moving[process] = original
        try:
            copy = cloner.migrate(parked, self.config.run_dir)
        except criu.RestoreFailed:
            self._on_exit(process, original.wait())  # it died with the dump
            raise
        except BaseException:
            with self._lock:  # no dump: alive and parked, its exit is its own again
                del self._moving[process]
            raise
        with self._lock:
            self._notices[process] = copy.notice
        self._adopt(process, copy.process, copy.channel)
        return copy

    def clone_replica(self, action: CloneReplica) -> Event:
        """Clone the donor of ``action`` into a new spare (see :mod:`agent.cloning`)."""
        return cloning.clone_replica(self, action)

    def migrate_worker(self, action: MigrateWorker) -> Event:
        """Move the process of ``action`` into a copy of itself (see :mod:`agent.cloning`)."""
        return cloning.migrate_worker(self, action)

    @staticmethod
    def stop_worker(outer: int) -> None:
        """SIGSTOP the worker under the :mod:`nsinit` outer ``outer`` (a hang drill): the
        outer's group holds only the outer. Never its init, which must stay awake to end the
        namespace once the outer is killed (the fence)."""
        with contextlib.suppress(OSError):  # gone meanwhile: nothing to stop
            os.kill(nsinit.tree(outer).worker, signal.SIGSTOP)

    def _parked_record(self, process: str) -> cloner.Parked:
        with self._lock:
            proc, channel, notice = (
                self._procs[process],
                self._parks[process],
                self._notices[process],
            )
        return cloner.Parked(proc.pid, channel, notice)

    def _token(self) -> str:
        return self.environment["TORCHRELAY_TOKEN"]
