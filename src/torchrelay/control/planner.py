"""Recovery planning as pure functions over plain data.

Given who fills which slot, which slots failed, what every survivor has committed and which
spares are ready, decide the next generation: who takes each failed slot, which step everyone
resumes from, who sends state and who receives it. No processes, sockets or torch here, so
every decision is unit-tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass


class PlanningError(RuntimeError):
    """Recovery is impossible with what is alive; the message says why."""


@dataclass(frozen=True)
class Spare:
    """A spare process that reached its first step boundary and can take a slot."""

    process: str
    node: str


@dataclass(frozen=True)
class RecoveryPlan:
    """Generation ``generation``: ``assignments`` maps every slot to its process.

    Every member ends the recovery holding the state after ``target_step`` and resumes at
    ``target_step + 1``. ``sources`` (slots at the target) stream state to ``receivers``
    (replacements and laggards). ``lost_steps`` counts committed steps that no survivor holds
    (always 0 while one replica survives).
    """

    generation: int
    target_step: int
    assignments: dict[int, str]
    sources: tuple[int, ...]
    receivers: tuple[int, ...]
    replaced: dict[int, str]
    lost_steps: int


def choose_replacements(
    failed: dict[int, str], spares: list[Spare], slot_nodes: dict[int, str]
) -> dict[int, Spare]:
    """Give each failed slot a spare, preferring spares on another node than the failed one.

    ``failed`` maps slot -> the node it ran on. Slots are served in order; a spare on a
    different node than the failure wins over one on the same node (a failing node often takes
    its neighbours with it), ties go to the spare that became ready first. Raises
    :class:`PlanningError` when there are fewer spares than failed slots.
    """
    if len(spares) < len(failed):
        raise PlanningError(
            f"{len(failed)} slot(s) to refill but only {len(spares)} spare(s) ready"
        )
    pool = list(spares)
    chosen: dict[int, Spare] = {}
    for slot in sorted(failed):
        bad_node = failed[slot] or slot_nodes.get(slot, "")
        pick = next((s for s in pool if s.node != bad_node), pool[0])
        pool.remove(pick)
        chosen[slot] = pick
    return chosen


NO_LIVE_REPLICA = "no live replica survives"
"""How a failure that live recovery cannot cure begins (the launcher falls back to a durable
checkpoint on it, see agent/fallback.py)."""


def plan_recovery(
    generation: int,
    assignments: dict[int, str],
    replacements: dict[int, Spare],
    committed: dict[int, int],
    highest_committed: int,
    invalid: frozenset[int] = frozenset(),
) -> RecoveryPlan:
    """Plan generation ``generation + 1`` after the slots in ``replacements`` failed.

    ``committed`` holds the last committed step reported by each surviving slot (invariant 3:
    every rank is either at s or s+1). The target is the highest of them; survivors below it
    are laggards and receive state like the replacements do. ``highest_committed`` is the
    highest step any rank ever reported committed, so a dead rank that was ahead would show up
    as lost steps instead of being silently dropped. Slots in ``invalid`` hold no usable state
    (a receiver interrupted mid-transfer, a spare that never received): they always receive.
    Before any commit (a target of -1) the lowest survivor is the only source.
    """
    survivors = {
        slot: step
        for slot, step in committed.items()
        if slot not in replacements and slot not in invalid
    }
    stale = tuple(slot for slot in committed if slot in invalid and slot not in replacements)
    if not survivors:
        raise PlanningError(
            f"{NO_LIVE_REPLICA}: every slot failed, so there is no source for the state "
            "(live recovery needs at least one healthy data-parallel replica)"
        )
    target = max(survivors.values())
    sources = tuple(sorted(slot for slot, step in survivors.items() if step == target))
    laggards = tuple(sorted(slot for slot, step in survivors.items() if step < target))
    if target < 0:
        # Nothing committed: the state is the set-up's, which DDP's first broadcast makes
        # equal, and which a set-up collective the failure aborted left each survivor's own
        # (runtime.facade): one source, as that broadcast would have been.
        sources, laggards = sources[:1], sources[1:]
    new_assignments = dict(assignments)
    for slot, spare in replacements.items():
        new_assignments[slot] = spare.process
    return RecoveryPlan(
        generation=generation + 1,
        target_step=target,
        assignments=new_assignments,
        sources=sources,
        receivers=tuple(sorted((*replacements, *laggards, *stale))),
        replaced={slot: spare.process for slot, spare in replacements.items()},
        lost_steps=max(0, highest_committed - target),
    )
