"""The launcher's side of durable checkpoints: resuming a run directory, and the ledger's record.

``torchrelay run --resume`` (the same command again, same run directory) continues a job whose
launcher and workers all died, or that ended: the run directory is claimed again (refused while
its launcher lives: every launcher holds an exclusive ``flock`` on its ledger), the newest
complete and verified checkpoint is chosen (:func:`torchrelay.checkpoints.choose`), and the
ledger goes on with a ``resumed`` event that counts the steps replayed. While a job with
``--checkpoint-dir`` runs, :class:`Recorder` writes its progress and each new checkpoint into
the ledger, so that the count is known even when the launcher was killed.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from torchrelay import checkpoints as layout
from torchrelay.agent.rundir import JOB_FILES, LEDGER, RunDirError
from torchrelay.config import JobConfig
from torchrelay.events import (
    CheckpointSaved,
    Event,
    Failure,
    FallbackRestart,
    JobEnd,
    Progress,
    RecoveryDone,
    Resumed,
)
from torchrelay.ledger import Ledger

RECORD_INTERVAL = 1.0  # seconds between progress records (only when the step moved)


def checkpoint_environment(config: JobConfig) -> dict[str, str]:
    """The workers' environment for ``--checkpoint-dir`` and ``--resume`` (empty without)."""
    env = {}
    if config.checkpoint_dir is not None and config.checkpoint_every is not None:
        env[layout.DIR_ENV] = str(config.checkpoint_dir.resolve())
        env[layout.EVERY_ENV] = str(config.checkpoint_every)
    if config.resume is not None and config.resume.directory is not None:
        env[layout.RESUME_ENV] = str(config.resume.directory.resolve())
    return env


def hold(ledger: Path) -> int:
    """Lock ``ledger`` for this launcher's lifetime (the kernel lets go when it dies); the fd.
    :class:`RunDirError` if another live launcher holds it."""
    fd = os.open(ledger, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirError(
            f"--run-dir {ledger.parent} belongs to a job that is still running (its launcher "
            "holds the ledger); stop it first"
        ) from None
    except OSError:
        pass  # a filesystem without locks (some NFS): --resume cannot tell a live job then
    return fd


def reclaim_run_dir(run_dir: Path) -> tuple[Path, int]:
    """For ``--resume``: the ledger of a job whose launcher is gone, and the lock on it; the
    previous launcher's token and endpoint are removed (this one publishes its own)."""
    ledger = run_dir / LEDGER
    if not ledger.is_file():
        raise RunDirError(f"--resume: {run_dir} holds no job (no {LEDGER}); run without --resume")
    fd = hold(ledger)
    for name in JOB_FILES:
        if name != LEDGER:
            (run_dir / name).unlink(missing_ok=True)
    return ledger, fd


def last_committed(events: list[Event]) -> int:
    """The highest step the ledger says was committed (-1: none)."""
    highest = -1
    for event in events:
        if isinstance(event, (Progress, CheckpointSaved)):
            highest = max(highest, event.step)
        elif isinstance(event, JobEnd):
            highest = max(highest, event.steps_committed - 1)
        elif isinstance(event, RecoveryDone):
            highest = max(highest, event.target_step)
        elif isinstance(event, Failure):
            highest = max(highest, event.last_reported_step)
    return highest


def resumed_event(
    events: list[Event], config: JobConfig, now: float | None = None
) -> Resumed | FallbackRestart:
    """What the ledger says about going on from ``config.resume`` after ``events``: resumed
    (``--resume``), or restarted by the launcher itself (``config.fallback``)."""
    choice = config.resume
    assert choice is not None and choice.directory is not None and choice.manifest is not None
    last = last_committed(events)
    if config.fallback is not None:
        attempt, reason = config.fallback
        return FallbackRestart(
            reason=reason,
            from_step=choice.manifest.step,
            checkpoint=str(choice.directory),
            steps_lost=max(0, last - choice.manifest.step),
            attempt=attempt,
        )
    stamped = [e.t for e in events if e.t is not None]
    now = time.time() if now is None else now
    return Resumed(
        from_step=choice.manifest.step,
        checkpoint=str(choice.directory),
        last_committed=last,
        steps_replayed=max(0, last - choice.manifest.step),
        outage_seconds=now - max(stamped) if stamped else None,
        skipped=choice.skipped,
    )


def choose_for_resume(root: Path, world_size: int) -> layout.Choice:
    """The checkpoint to resume from; :class:`~torchrelay.checkpoints.CheckpointError` (one
    line) when none is usable or it does not fit this job."""
    choice = layout.choose(root)
    if choice.directory is None or choice.manifest is None:
        why = f" ({'; '.join(choice.skipped)})" if choice.skipped else ""
        raise layout.CheckpointError(f"--resume: no complete checkpoint in {root}{why}")
    layout.check_compatible(choice.manifest, world_size, choice.directory)
    return choice


def set_aside_refused(config: JobConfig) -> None:
    """Move the checkpoints newer than the one resumed from (refused) out of the way: the
    resumed job writes those steps again."""
    choice = config.resume
    if choice is not None and choice.manifest is not None and config.checkpoint_dir is not None:
        layout.set_aside(config.checkpoint_dir, choice.manifest.step)


@dataclass
class Recorder:
    """Writes ``progress`` (the highest committed step, when it moved, at most once per
    :data:`RECORD_INTERVAL`) and ``checkpoint`` (each new complete one) into the ledger."""

    ledger: Ledger
    root: Path
    step: int = -1
    saved: int = -1
    _next: float = 0.0

    def tick(self, committed: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + RECORD_INTERVAL
        if committed > self.step:
            self.step = committed
            self.ledger.write(Progress(step=committed).to_json())
        steps = layout.complete_steps(self.root)
        if steps and steps[0] > self.saved:
            self.saved = steps[0]
            path = layout.step_dir(self.root, steps[0])
            self.ledger.write(CheckpointSaved(step=steps[0], path=str(path)).to_json())
