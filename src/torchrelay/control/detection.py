"""Failure detection from heartbeats, as a pure function over plain data.

Every worker reports, twice a second and off its training thread, how long it has been inside
its current step and how long its oldest pending collective has been waiting. From the last
report of each slot the controller tells three faults apart, all against one timeout derived
from the job's own median step time (see :meth:`Controller.hang_timeout`):

- **hung**: the process went silent (SIGSTOP, a GIL-holding C call, a dead host or a cut
  network). It is fenced and replaced. When every slot is silent at once, the controller
  itself is the likelier culprit, so that counts only past :data:`ALL_SILENT` timeouts.
- **stalled**: it still heartbeats but has been inside one step for longer than the timeout
  without waiting on any collective, so its peers wait for it (a deadlocked data loader, a
  stuck kernel). It is fenced and replaced; a stall counts against ``--max-restarts`` because
  a deterministic one would come back on every replacement. Work the script declares with
  ``relay.busy(...)`` (an evaluation, a checkpoint on one rank) is never a stall.
- **lost collective**: every slot heartbeats and every slot has waited on a collective for
  longer than the timeout: a collective that will never return although nobody is missing (a
  dropped message, a communicator bug). Nobody is replaced; the same members abort the step
  and re-form the communicator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Beat:
    """The last heartbeat of one slot's worker, as seen by the controller.

    ``silent`` is the time since that heartbeat arrived; ``step_age`` and ``waiting`` are as
    of that heartbeat (``None``: not inside a step / no collective pending).
    """

    slot: int
    silent: float
    step_age: float | None = None
    waiting: float | None = None
    busy: bool = False


@dataclass(frozen=True)
class Verdict:
    """What to do about each slot. ``lost_collective`` is a reason, or ``None``."""

    hung: dict[int, str]
    stalled: dict[int, str]
    lost_collective: str | None = None

    @property
    def healthy(self) -> bool:
        return not self.hung and not self.stalled and self.lost_collective is None


ALL_SILENT = 3.0
"""Every slot silent at once counts as hung only past this many hang timeouts (see judge)."""


def judge(beats: list[Beat], timeout: float, fresh: float) -> Verdict:
    """Classify every slot from its last heartbeat.

    ``fresh`` is how recent a heartbeat must be to vouch for a live process (a few heartbeat
    intervals): a stall or a lost collective is only declared on fresh evidence, so a process
    that has merely gone quiet is left to the (longer) silence rule instead of being mistaken
    for a stall.
    """
    hung = {
        b.slot: f"heartbeat silent for {b.silent:.1f} s (hang timeout {timeout:.1f} s)"
        for b in beats
        if b.silent > timeout
    }
    if len(hung) == len(beats) > 1 and min(b.silent for b in beats) <= ALL_SILENT * timeout:
        # Every slot silent at once is more likely this controller's own stall (starved of CPU,
        # its network) than every worker hanging together, and fencing them all can only end
        # the job (no replica would be left to recover from): wait longer before believing it.
        hung = {}
    stalled = {
        b.slot: (
            f"stalled {b.step_age + b.silent:.1f} s inside one step without waiting on a "
            f"collective (hang timeout {timeout:.1f} s)"
        )
        for b in beats
        if b.silent <= fresh
        and not b.busy
        and b.step_age is not None
        and b.waiting is None
        and b.step_age + b.silent > timeout
    }
    lost = None
    if beats and not hung and not stalled and not any(b.busy for b in beats):
        waits = [
            b.waiting + b.silent
            for b in beats
            if b.silent <= fresh and b.waiting is not None and b.step_age is not None
        ]
        if len(waits) == len(beats) and min(waits) > timeout:
            lost = (
                f"every rank has waited {min(waits):.1f} s or more on a collective that never "
                f"completed, while all of them heartbeat (hang timeout {timeout:.1f} s)"
            )
    return Verdict(hung, stalled, lost)
