"""The monitor's decisions: hung and stalled workers, lost collectives, silent nodes, stragglers.

:func:`tick` runs every monitor interval over the :class:`JobState`; the judging itself is the
pure :func:`torchrelay.control.detection.judge`. A hung or stalled worker is marked ``FENCING``
and killed (its exit then starts the recovery); a lost collective re-forms the same members; a
node silent for ``--node-timeout`` is declared lost.
"""

from __future__ import annotations

import bisect
import signal
import statistics

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control import handover
from torchrelay.control.actions import Action, Record, StartRecovery
from torchrelay.control.departures import OutputTail, node_lost
from torchrelay.control.detection import Beat, judge
from torchrelay.control.endings import fail
from torchrelay.control.errors import ProtocolError
from torchrelay.control.nodes import signal as signal_process
from torchrelay.control.state import Detection, JobPhase, JobState, Member, MemberState, move

# A heartbeat younger than this vouches for a live process (heartbeats go out every 0.5 s).
FRESH_HEARTBEAT = 2.0
UNWATCHED = frozenset({MemberState.DEAD, MemberState.FENCED, MemberState.FENCING})


def hang_timeout(job: JobState, config: JobConfig) -> float:
    """Heartbeat silence that means a hang: a multiple of the job's median step time."""
    steps = [m.timings["step_seconds"] for m in job.slot_members() if "step_seconds" in m.timings]
    median = statistics.median(steps) if steps else 0.0
    return max(config.hang_floor, config.hang_factor * median)


def tick(job: JobState, config: JobConfig, now: float, output_tail: OutputTail) -> list[Action]:
    """One monitor round. Past their loops (finishing) workers neither step nor beat."""
    job.hang_timeout = hang_timeout(job, config)
    actions = _check_nodes(job, config, now, output_tail)
    if job.phase is JobPhase.RUNNING:
        actions += _check_workers(job, config, now) + _check_stragglers(job, config, now)
    return actions


def _check_nodes(
    job: JobState, config: JobConfig, now: float, output_tail: OutputTail
) -> list[Action]:
    actions: list[Action] = []
    for entry in list(job.nodes.values()):
        silent = now - entry.last_seen
        if entry.alive and silent > config.node_timeout:
            reason = (
                f"no heartbeat for {silent:.1f} s, node timeout "
                f"{config.node_timeout:.1f} s: crashed or cut off"
            )
            actions += node_lost(job, config, entry.name, reason, now, output_tail)
    return actions


def _check_workers(job: JobState, config: JobConfig, now: float) -> list[Action]:
    """Fence hung and stalled workers; re-form the group around a lost collective."""
    watched = [m for m in job.slot_members() if m.state not in UNWATCHED]
    # Until a step has been timed, a slow first step (compilation, warm-up) is no stall.
    timed = any("step_seconds" in m.timings for m in watched)
    beats = []
    for m in watched:
        assert m.slot is not None
        step_age, waiting = (m.step_age, m.waiting) if timed else (None, None)
        beats.append(Beat(m.slot, now - m.last_seen, step_age, waiting, m.busy))
    verdict = judge(beats, job.hang_timeout, FRESH_HEARTBEAT)
    actions: list[Action] = []
    for member in watched:
        for detection, reasons in (
            (Detection.HEARTBEAT, verdict.hung),
            (Detection.STALL, verdict.stalled),
        ):
            if member.slot in reasons:
                move(member, MemberState.FENCING)
                member.detection, member.detected_by = detection, reasons[member.slot]
                detected = events.HangDetected(
                    process=member.process,
                    slot=member.slot,
                    detection=detection.value,
                    reason=reasons[member.slot],
                    silent_seconds=now - member.last_seen,
                    timeout=job.hang_timeout,
                )
                fence = signal_process(job, member.process, signal.SIGKILL, stacks=True)
                actions += [Record(detected), *fence]
    recovery = job.recovery
    quiet = not recovery.failed and recovery.current is None and recovery.reform is None
    if verdict.lost_collective is not None and quiet and len(watched) == len(job.assignments):
        actions += _collective_lost(job, config, verdict.lost_collective, now, watched)
    return actions


def _collective_lost(
    job: JobState, config: JobConfig, reason: str, now: float, members: list[Member]
) -> list[Action]:
    """Abort the step everywhere and re-form the same members (nobody is replaced)."""
    step = job.highest_committed + 1
    at, count = job.recovery.reforms_at
    count = count + 1 if at == step else 1
    job.recovery.reforms_at = (step, count)
    failure = {
        "slot": None,
        "process": f"collective@g{job.generation}",
        "last_reported_step": job.highest_committed,
        "cause": "collective never completed",
        "kind": "collective",
        "detected_by": reason,
        "generation": job.generation,
        "t": now,
        "onset": now - max(m.waiting or 0.0 for m in members),
    }
    actions: list[Action] = [Record(events.Failure(**failure))]
    if count > config.max_restarts:
        return actions + fail(
            job,
            f"the collectives of step {step} never completed, even after re-forming the "
            f"communicator {count - 1} time(s) (max restarts {config.max_restarts}): "
            "a deterministic deadlock (mismatched collectives across ranks?) or a broken "
            "network path",
        )
    job.recovery.reform = failure
    return [*actions, StartRecovery()]


def _check_stragglers(job: JobState, config: JobConfig, now: float) -> list[Action]:
    """Record a rank whose compute per step is ``straggler_ratio`` times its peers' median;
    with ``--drain-stragglers N``, hand its slot over once it stayed one for N monitor
    rounds in a row (its device is not quarantined: slowness may be its neighbours')."""
    # A host (--elastic, shrunk) runs a micro-batch per slot it holds: compare per micro-batch.
    held = {slot: 1 + sum(1 for h in job.hosted.values() if h == slot) for slot in job.assignments}
    compute = {
        slot: m.timings["compute_seconds"] / held[slot]
        for slot, m in job.by_slot().items()
        if "compute_seconds" in m.timings
    }
    if len(compute) < 2:
        return []
    actions: list[Action] = []
    ordered = sorted(compute.values())
    for slot, seconds in compute.items():
        peers = median_without(ordered, seconds)
        slow = seconds > config.straggler_ratio * peers and seconds - peers > 0.01
        process = job.assignments[slot]
        if slow and process not in job.stragglers:
            job.stragglers[process] = {
                "slot": slot,
                "compute_seconds": seconds,
                "peers_median": peers,
                "slowdown": seconds / peers,
            }
            actions.append(Record(events.Straggler(process=process, **job.stragglers[process])))
        if process in job.stragglers:
            rounds = job.straggler_rounds.get(process, 0) + 1 if slow else 0
            job.straggler_rounds[process] = rounds
            if config.drain_stragglers and rounds == config.drain_stragglers:
                reason = (
                    f"straggler: {seconds / peers:.1f}x its peers' compute per step for "
                    f"{rounds} monitor rounds"
                )
                try:
                    actions += handover.request(job, [slot], reason, now, now)
                except ProtocolError as exc:
                    gave_up = events.HandoverAbandoned(slots=(slot,), reason=str(exc))
                    actions.append(Record(gave_up))
    return actions


def median_without(ordered: list[float], value: float) -> float:
    """The median of sorted ``ordered`` with one occurrence of ``value`` left out (a rank's
    peers), as ``statistics.median`` gives it, in O(log n): the monitor takes one per slot
    every tick, and a median per slot over a fresh list would be quadratic in the job's size."""
    left_out = bisect.bisect_left(ordered, value)
    rest = len(ordered) - 1

    def at(index: int) -> float:
        return ordered[index] if index < left_out else ordered[index + 1]

    if rest % 2:
        return at(rest // 2)
    return (at(rest // 2 - 1) + at(rest // 2)) / 2
