"""How a job ends: every slot done (finishing), then success, or a failure, or a stop.

Pure transitions over :class:`JobState`: each sets the phase (and the one outcome) and returns
the actions that tell the processes and node agents.
"""

from __future__ import annotations

from typing import Any

from torchrelay.control.actions import Action, EndJob, Record, Send, SendToNode
from torchrelay.control.protocol import Finish, FinishNode
from torchrelay.control.state import JobPhase, JobState, MemberState
from torchrelay.events import TrainingDone

FINISH = Finish()


def end(job: JobState, phase: JobPhase, **details: Any) -> list[Action]:
    """Set the job's one outcome (``job_end``, with the refused-request counts)."""
    job.phase = phase
    job.outcome = {"status": phase.value, **details, "steps_committed": job.highest_committed + 1}
    return [EndJob(dict(job.outcome))]


def fail(job: JobState, reason: str, traceback: str | None = None) -> list[Action]:
    """End the job as failed with ``reason``; nothing once it has ended."""
    if job.finished:
        return []
    return end(
        job, JobPhase.FAILED, reason=reason, **({"traceback": traceback} if traceback else {})
    )


def terminate(job: JobState, signal_name: str) -> list[Action]:
    """End the job as terminated: stopped from outside, not failed."""
    if job.finished:
        return []
    return end(
        job,
        JobPhase.TERMINATED,
        signal=signal_name,
        reason="stopped from outside (a scheduler, an operator or Ctrl-C); "
        "workers and spares were stopped",
    )


def succeed(job: JobState) -> list[Action]:
    """The job succeeded; each node learns which of its processes joined (the others are
    spares still starting: its agent stops them, see :class:`FinishNode`)."""

    def joined(node: str) -> tuple[str, ...]:
        return tuple(sorted(m.process for m in job.members.values() if m.node == node))

    finish = [SendToNode(n, FinishNode(joined=joined(n))) for n in job.nodes]
    return end(job, JobPhase.SUCCEEDED) + finish


def finish_training(job: JobState) -> list[Action]:
    """Every slot committed its last step: let every process out of its loop. The job succeeds
    once the slots' processes have all exited with 0 (see departures)."""
    job.phase = JobPhase.FINISHING
    done = Record(TrainingDone(steps_committed=job.highest_committed + 1))
    return [done] + [Send(p, FINISH) for p in job.members]


def finish_if_all_done(job: JobState) -> list[Action]:
    """Finish training once every slot's member reported its last step done."""
    if all(m.state is MemberState.DONE for m in job.slot_members()):
        return finish_training(job)
    return []
