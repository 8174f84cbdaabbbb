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


def resume_hint(config: JobConfig, argv: Sequence[str]) -> str | None:
    """For a failed job with a complete checkpoint: the line naming the ``--resume`` command
    (``argv``: this command's arguments after ``torchrelay``, starting with ``run``)."""
    if config.checkpoint_dir is None:
        return None
    choice = layout.choose(config.checkpoint_dir)
    if choice.manifest is None:
        return None
    kept = [a for a in argv if a != "--resume"]
    command = shlex.join(["torchrelay", *kept[:1], "--resume", *kept[1:]])
    return (
        f"torchrelay: the newest complete checkpoint is step {choice.manifest.step} "
        f"({choice.directory}); go on from it with: {command}"
    )
