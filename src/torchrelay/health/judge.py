"""Which devices to migrate off, and when: hysteresis and a rate limit over readings.

A pure function over plain data, :func:`judge` ``(state, readings, now) -> (state, advice)``,
in the style of torch.distributed.elastic's rendezvous ops: the caller (the controller) keeps
the :class:`HealthJudge` state and carries out the :class:`MigrationAdvice` it returns.

Per device (``(node, device)``), a :class:`Track` goes through these states::

    healthy --warning--> warned (streak n) --n reaches persist_polls--> flagged
    healthy/warned --fault--> flagged                     (at once: no hysteresis)
    warned --a clean poll--> healthy                      (the streak must be consecutive)
    flagged --clear_polls clean polls in a row--> healthy (and may be advised again later)

A poll is one batch of readings (one node's, typically); a device with no reading in the
batch keeps its track as it was (no news is not a clean poll). Several readings of one device
in a batch (NVML's and an injected one) count as one poll, unhealthy if any is.

A flagged device that has not been advised yet is advised when the rate limit allows:

* at most ``max_migrations`` advice per ``window_seconds`` across the job, and
* at most ``policy.concurrent(world_size)`` handovers in flight at once (advised and not yet
  reported :func:`finished` by the caller),

so that a bad rack (every GPU hot at once) does not drain the whole job in one go. A FAULT
skips both limits: the device is failing now, and waiting would only leave its worker to the
crash path; it still counts against them. Among those waiting, faults go first, then the
earliest warned. Each flagged device is advised once, until it clears.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from torchrelay.health.policy import Finding, HealthPolicy, Severity, findings
from torchrelay.health.readings import Reading

Key = tuple[str, int]  # (node, device index)


@dataclass(frozen=True)
class Track:
    """What the judge remembers of one device (see the module docstring's states)."""

    warn_streak: int = 0  # consecutive polls with a warning (0 once flagged by a fault)
    clean_streak: int = 0  # consecutive clean polls
    flagged: bool = False
    advised: bool = False
    since: float | None = None  # the time of the first warning of the current episode
    trigger: Reading | None = None  # the reading that flagged it
    finding: Finding | None = None  # the finding it was flagged for


@dataclass(frozen=True)
class MigrationAdvice:
    """Move whatever runs on ``node``'s ``device`` (``slot``/``process`` when the reading
    named them) to a spare, and stop handing that device out. ``since`` is when the episode's
    first warning was read: ``handover time - since`` is the lead time."""

    node: str
    device: int
    slot: int | None
    process: str | None
    severity: Severity
    reason: str
    trigger: Reading
    since: float
    t: float


@dataclass(frozen=True)
class HealthJudge:
    """The judge's state: plain data, replaced (never mutated) by :func:`judge`."""

    policy: HealthPolicy
    world_size: int
    tracks: Mapping[Key, Track] = field(default_factory=dict)
    advised_at: tuple[float, ...] = ()  # times of the advice still inside the window
    in_flight: frozenset[Key] = frozenset()


def judge(
    state: HealthJudge, readings: Iterable[Reading], now: float
) -> tuple[HealthJudge, list[MigrationAdvice]]:
    """Fold one poll of ``readings`` into ``state``; the advice it allows at ``now``."""
    polled: dict[Key, list[Reading]] = {}
    for reading in readings:
        polled.setdefault(reading.key, []).append(reading)
    tracks = dict(state.tracks)
    for key, batch in polled.items():
        tracks[key] = _step(state.policy, tracks.get(key, Track()), batch)
    window = tuple(t for t in state.advised_at if now - t < state.policy.window_seconds)
    state = dataclasses.replace(state, tracks=tracks, advised_at=window)
    waiting = [
        k for k, tr in tracks.items() if tr.flagged and not tr.advised and k not in state.in_flight
    ]
    waiting.sort(key=lambda k: (not _is_fault(tracks[k]), _since(tracks[k], now), k))
    advice = []
    for key in waiting:
        track = tracks[key]
        if not _is_fault(track) and not _room(state):
            continue  # waits for the window to pass or a handover to finish
        assert track.trigger is not None and track.finding is not None
        advice.append(
            MigrationAdvice(
                node=key[0],
                device=key[1],
                slot=track.trigger.slot,
                process=track.trigger.process,
                severity=track.finding.severity,
                reason=track.finding.reason,
                trigger=track.trigger,
                since=_since(track, now),
                t=now,
            )
        )
        state = dataclasses.replace(
            state,
            tracks={**state.tracks, key: dataclasses.replace(track, advised=True)},
            advised_at=(*state.advised_at, now),
            in_flight=state.in_flight | {key},
        )
    return state, advice


def finished(state: HealthJudge, node: str, device: int) -> HealthJudge:
    """The handover advised for ``(node, device)`` is over (done or given up): it no longer
    counts against the concurrency limit. The device stays flagged until it reads clean."""
    return dataclasses.replace(state, in_flight=state.in_flight - {(node, device)})


def _room(state: HealthJudge) -> bool:
    policy = state.policy
    return len(state.advised_at) < policy.max_migrations and len(
        state.in_flight
    ) < policy.concurrent(state.world_size)


def _since(track: Track, now: float) -> float:
    return track.since if track.since is not None else now


def _is_fault(track: Track) -> bool:
    return track.finding is not None and track.finding.severity is Severity.FAULT


def _step(policy: HealthPolicy, track: Track, batch: list[Reading]) -> Track:
    """One poll of one device: ``batch`` holds its readings (several sources)."""
    found = [(f, r) for r in batch for f in findings(policy, r)]
    faults = [(f, r) for f, r in found if f.severity is Severity.FAULT]
    if faults:
        finding, reading = faults[0]
        if _is_fault(track) and track.flagged:
            return dataclasses.replace(track, clean_streak=0)  # still failing: same episode
        return dataclasses.replace(
            track,
            warn_streak=0,
            clean_streak=0,
            flagged=True,
            since=track.since if track.since is not None else reading.t,
            trigger=reading,
            finding=finding,
        )
    if found:
        finding, reading = found[0]
        streak = track.warn_streak + 1
        since = track.since if track.since is not None else reading.t
        if track.flagged:
            return dataclasses.replace(track, warn_streak=streak, clean_streak=0, since=since)
        flagged = streak >= policy.persist_polls
        return dataclasses.replace(
            track,
            warn_streak=streak,
            clean_streak=0,
            flagged=flagged,
            since=since,
            trigger=reading if flagged else None,
            finding=finding if flagged else None,
        )
    clean = track.clean_streak + 1
    if track.flagged and clean < policy.clear_polls:
        return dataclasses.replace(track, warn_streak=0, clean_streak=clean)
    return Track(clean_streak=clean)
