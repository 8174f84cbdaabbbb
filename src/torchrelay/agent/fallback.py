"""The last resort, automatic: when no live replica survives, restart the job from a checkpoint.

Live recovery needs one healthy data-parallel replica of the state. When the controller finds
none (:data:`~torchrelay.control.planner.NO_LIVE_REPLICA`: every slot failed at once), the job
ends as failed and every process is stopped. With ``--checkpoint-dir`` and a complete
checkpoint, :func:`next_attempt` then gives the configuration of a new attempt: the same job,
resumed from the newest verified checkpoint (as ``--resume`` would), in the same run directory
and ledger, where it is recorded as ``fallback_restart`` with the steps lost. At most
``--max-restarts`` such restarts per command. Chaos drills that already fired are not injected
again (a real fault does not repeat because the steps are replayed).

One node only: on several nodes the other nodes' launchers lose their controller and stop, so
the job fails and its output names the ``--resume`` command instead (:func:`resume_hint`).
Pure decisions over plain data (the configuration, the outcome, the ledger's events).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchrelay import checkpoints as layout
from torchrelay.config import JobConfig
from torchrelay.control.planner import NO_LIVE_REPLICA
from torchrelay.events import ChaosFired, Event


def next_attempt(
    config: JobConfig, outcome: dict[str, Any], events: Sequence[Event]
) -> JobConfig | None:
    """The configuration that restarts the failed job from its newest checkpoint, or None
    (it did not fail for want of a live replica, no checkpoint, restarts used up, many nodes)."""
    reason = str(outcome.get("reason") or "")
    attempt = 1 if config.fallback is None else config.fallback[0] + 1
    if (
        outcome.get("status") != "failed"
        or NO_LIVE_REPLICA not in reason
        or config.checkpoint_dir is None
        or config.nnodes != 1
        or attempt > config.max_restarts
    ):
        return None
    choice = layout.choose(config.checkpoint_dir)
    if choice.manifest is None or choice.manifest.world_size != config.world_size:
        return None
    fired = {e.id for e in events if isinstance(e, ChaosFired)}
    return dataclasses.replace(
        config,
        resume=choice,
        fallback=(attempt, reason),
        chaos=[e for e in config.chaos if e.id not in fired],
    )


def resume_hint(config: JobConfig, flags: Sequence[str], entry: Sequence[str]) -> str | None:
    """For a failed job with a complete checkpoint: the line naming the ``--resume`` command
    (see :func:`resume_command`)."""
    if config.checkpoint_dir is None:
        return None
    choice = layout.choose(config.checkpoint_dir)
    if choice.manifest is None:
        return None
    return (
        f"torchrelay: the newest complete checkpoint is step {choice.manifest.step} "
        f"({choice.directory}); go on from it with: "
        f"{resume_command(config.run_dir, flags, entry)}"
    )


RUN_DIR_FLAGS = ("--run-dir",)
LOG_DIR_FLAGS = ("--log-dir", "--log_dir")


def resume_command(run_dir: Path, flags: Sequence[str], entry: Sequence[str]) -> str:
    """The command that goes on with the job of ``run_dir``: ``torchrelay run --resume`` with
    this command's launcher ``flags`` and ``entry`` (the script and its arguments). Where no
    ``--run-dir`` was given (the default one, or one made under ``--log-dir``), it is named,
    and ``--log-dir`` left out (the two do not go together): ``--resume`` needs it."""
    kept = [flag for flag in flags if flag != "--resume"]
    if not _given(kept, RUN_DIR_FLAGS):
        kept = [*_without(kept, LOG_DIR_FLAGS), "--run-dir", str(run_dir)]
    return shlex.join(["torchrelay", "run", "--resume", *kept, *entry])


def _given(flags: Sequence[str], names: tuple[str, ...]) -> bool:
    return any(flag in names or flag.startswith(tuple(f"{n}=" for n in names)) for flag in flags)


def _without(flags: Sequence[str], names: tuple[str, ...]) -> list[str]:
    """``flags`` less ``NAME VALUE`` and ``NAME=VALUE`` for each of ``names``."""
    kept: list[str] = []
    value_next = False
    for flag in flags:
        if value_next:
            value_next = False
        elif flag in names:
            value_next = True
        elif not _given([flag], names):
            kept.append(flag)
    return kept
