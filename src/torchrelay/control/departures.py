"""Exits: a process ended (its agent saw it), or a whole node was lost.

Pure transitions over :class:`JobState`. An exit is a failure of its slot (a recovery starts)
unless the job is finishing (then it decides success), the process was a spare (another is
started), or it is a script bug every rank would hit (the job stops with the traceback).

``output_tail(process)`` reads the last traceback its agent logged: an input like ``now``,
read only, so tests pass a dict's ``get``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control import drills
from torchrelay.control.actions import Action, QuarantineDevice, Record, Refused, StartRecovery
from torchrelay.control.endings import fail, succeed
from torchrelay.control.errors import FencedError
from torchrelay.control.nodes import node_of
from torchrelay.control.protocol import ChaosNotice, NodeExit, NodeReport
from torchrelay.control.spares import spare_accounted, start_spare
from torchrelay.control.state import (
    GONE,
    Detection,
    JobPhase,
    JobState,
    Member,
    MemberState,
    move,
)
from torchrelay.control.verdicts import (
    after_loop_reason,
    describe_exit,
    fails_before_first_step,
    finish_verdict,
    first_step_bug_reason,
    lost_in_setup,
    never_joined,
    spare_node,
    step_in_flight,
    unjoined_failure,
    worker_slot,
)
from torchrelay.exits import EXIT_COMMUNICATOR_STUCK, SELF_FENCED

OutputTail = Callable[[str], str]


def on_exit(
    job: JobState,
    config: JobConfig,
    process: str,
    returncode: int,
    cause: str,
    now: float,
    output_tail: OutputTail,
) -> list[Action]:
    """``process`` exited with ``returncode`` (negative: killed by a signal)."""
    member = job.members.get(process)
    if member is None:
        note = "exited before joining"
        actions: list[Action] = [
            Record(events.ProcessExit(process=process, returncode=returncode, note=note))
        ]
        if job.phase is JobPhase.RUNNING:
            actions += _early_exit(job, config, process, returncode, now, output_tail)
        elif worker_slot(process) is None:
            spare_accounted(job, spare_node(process))  # dismissed at the end while starting
        return actions
    was = member.state
    exited = Record(
        events.ProcessExit(
            process=process, slot=member.slot, returncode=returncode, cause=cause, state=was.value
        )
    )
    if was is MemberState.FENCED:
        return [exited]  # its node was declared lost: its slot was handled then
    move(member, MemberState.DEAD)
    member.returncode = returncode
    if was is MemberState.RETIRED:
        return [exited]  # it left after a handover: its slot runs elsewhere
    if job.phase is JobPhase.FINISHING:
        return [exited, *_exit_after_training(job, member, output_tail)]
    if job.finished or (was is MemberState.DONE and returncode == 0):
        return [exited]
    if member.slot is None or job.assignments.get(member.slot) != process:
        return [exited, *_spare_lost(job, config, member, cause)]
    return [exited, *_worker_lost(job, config, member, returncode, cause, now, output_tail)]


def _early_exit(
    job: JobState,
    config: JobConfig,
    process: str,
    returncode: int,
    now: float,
    output_tail: OutputTail,
) -> list[Action]:
    """A process died before it could even join: a broken script or environment (stop at
    once, see :func:`never_joined`), or a spare killed from outside (start another)."""
    output = output_tail(process)
    failure = unjoined_failure(process, returncode, output)
    actions: list[Action] = []
    if failure is not None:
        failed = events.Failure(**failure, generation=job.generation, t=now, onset=now)
        actions.append(Record(failed))
    reason = never_joined(process, returncode, output)
    if reason is not None:
        return actions + fail(job, reason, traceback=output or None)
    spare_accounted(job, spare_node(process))
    job.spare_failures += 1
    if job.spare_failures > config.max_restarts:
        return actions + fail(
            job,
            f"spares keep being killed before they join the job ({process}: "
            f"{describe_exit(returncode)}); see RUN_DIR/logs/{process}.log",
        )
    return actions + start_spare(job)


def _exit_after_training(job: JobState, member: Member, output_tail: OutputTail) -> list[Action]:
    """Once every slot finished its last step, the job succeeds only when all their
    processes exit with 0: a failure in the script's final work (saving) fails it."""
    if member.slot is None or job.assignments.get(member.slot) != member.process:
        return []  # a spare leaving at the end
    verdict, slot = finish_verdict({s: m.returncode for s, m in job.by_slot().items()})
    if verdict == "succeeded":
        return succeed(job)
    if verdict == "failed" and slot is not None:
        failed = job.by_slot()[slot]
        return fail(
            job,
            after_loop_reason(slot, failed.process, failed.returncode),  # type: ignore[arg-type]
            traceback=(failed.error or {}).get("traceback") or output_tail(failed.process) or None,
        )
    return []


def _spare_lost(job: JobState, config: JobConfig, member: Member, cause: str) -> list[Action]:
    job.spare_failures += 1
    traceback = (member.error or {}).get("traceback")
    lost = Record(events.SpareLost(process=member.process, cause=cause, traceback=traceback))
    if member.error is not None and job.spare_failures > config.max_restarts:
        return [
            lost,
            *fail(
                job,
                f"spares keep failing during setup (last: {member.process}, {cause}); "
                "this is a bug in the script, not a hardware failure",
                traceback=member.error["traceback"],
            ),
        ]
    return [lost, *start_spare(job)]


def _worker_lost(
    job: JobState,
    config: JobConfig,
    member: Member,
    returncode: int,
    cause: str,
    now: float,
    output_tail: OutputTail,
) -> list[Action]:
    """A slot's process is gone: record the failure, then stop (a script bug) or recover."""
    assert member.slot is not None
    kind = failure_kind(member, returncode)
    if kind == "stall":
        cause = f"a stall (fenced with {cause})"
    failure: dict[str, Any] = {
        "slot": member.slot,
        "process": member.process,
        "last_reported_step": member.committed,
        "cause": cause,
        "kind": kind,
        "detected_by": member.detected_by,
        "generation": job.generation,
        "t": now,
        # When it really stopped working: its last sign of life for a hang.
        "onset": onset(member, now),
    }
    if member.error is not None:
        failure["traceback"] = member.error["traceback"]
    step = step_in_flight(
        max(member.committed, job.highest_committed), (member.error or {}).get("step")
    )
    failure["step"] = step
    actions: list[Action] = [Record(events.Failure(**failure))]
    if fails_before_first_step(kind, job.highest_committed):
        lost = lost_in_setup(job.recovery.failed)
        return actions + fail(
            job,
            first_step_bug_reason(member.slot, member.process, step, cause, lost),
            traceback=failure.get("traceback") or output_tail(member.process) or None,
        )
    if kind in ("exception", "exit", "stall"):
        job.bug_restarts += 1
        if job.bug_restarts > config.max_restarts:
            return actions + fail(
                job,
                f"rank {member.slot} failed {job.bug_restarts} times (last: {cause} in "
                f"step {step}; max restarts {config.max_restarts}); "
                "this looks like a bug in the script, not a hardware failure",
                traceback=failure.get("traceback"),
            )
    job.recovery.failed[member.slot] = failure
    if kind == "signal" and member.device is not None and member.detection is not Detection.NODE:
        # Killed, or hung until fenced: the device may be at fault; no refill spare gets it
        # until an operator clears it (a script's own error or exit says nothing of it).
        reason = f"{member.process} died on it ({cause})"
        actions.append(QuarantineDevice(member.node, member.device, reason))
    return [*actions, StartRecovery()]


def failure_kind(member: Member, returncode: int) -> str:
    """``stall`` and script failures count against ``--max-restarts``; the others do not.
    ``communicator``: it left because an aborted collective outlived the cut of its
    connections (:data:`EXIT_COMMUNICATOR_STUCK`), which follows another loss: gloo's, not the
    script's, and bounded by the losses that cause it."""
    if member.detection is Detection.STALL:
        return "stall"
    if returncode in SELF_FENCED:
        return "fenced"
    if returncode == EXIT_COMMUNICATOR_STUCK:
        return "communicator"
    if returncode < 0:
        return "signal"
    return "exception" if member.error else "exit"


def onset(member: Member, now: float) -> float:
    """When the failed member really stopped being useful (for the stall accounting)."""
    if member.detection in (Detection.HEARTBEAT, Detection.NODE):
        return member.last_seen  # its last sign of life
    if member.detection is Detection.STALL and member.step_age is not None:
        return member.last_seen - member.step_age
    return now


def node_lost(
    job: JobState,
    config: JobConfig,
    node: str,
    reason: str,
    now: float,
    output_tail: OutputTail,
) -> list[Action]:
    """Declare ``node`` lost: every process on it exited, and is fenced (nobody here can kill
    them, so anything they may still send is refused). Its spares on the way are lost too."""
    entry = job.nodes[node]
    if not entry.alive or job.finished:
        return []
    entry.alive = False
    job.spares_launching.pop(node, None)
    lost = [m for m in job.members.values() if m.node == node and m.state not in GONE]
    names = [m.process for m in lost]
    declared = events.NodeLost(node=node, reason=reason, processes=tuple(names))
    actions: list[Action] = [Record(declared)]
    for member in lost:
        member.detection = Detection.NODE
        member.detected_by = f"node {node} lost ({reason})"
        actions += on_exit(
            job, config, member.process, -signal.SIGKILL, "node lost", now, output_tail
        )
        move(member, MemberState.FENCED)
    return actions


def node_report(
    job: JobState,
    config: JobConfig,
    node: str,
    report: NodeReport,
    now: float,
    output_tail: OutputTail,
) -> list[Action]:
    """A remote agent's heartbeat, a process exit it saw, or the start of a chaos drill.

    Refused with a :class:`FencedError` once the node was declared lost: its agent must stop
    its workers instead of bringing stale replicas back.
    """
    entry = node_of(job, node)
    if not entry.alive:
        error = FencedError(
            f"node {node} was declared lost ({entry.name} unheard of for more than "
            f"{config.node_timeout:.0f} s); its slots were handed to others"
        )
        raise Refused(error, [Record(events.FencedRefused(node=node, kind=report.TAG))])
    entry.last_seen = now
    if isinstance(report, NodeExit):
        returncode = report.returncode
        cause = describe_exit(returncode)
        return on_exit(job, config, report.exited, returncode, cause, now, output_tail)
    if isinstance(report, ChaosNotice):
        return drills.on_notice(entry, report)
    return []  # a heartbeat
