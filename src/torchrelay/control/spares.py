"""The spare pool: where to start spares, how many are on their way, which are ready.

Pure functions over :class:`JobState`. A spare is "launching" from the moment the controller
asks a node to start it until it joins or exits, "starting" until it reports ready at its first
step boundary, then "ready" until a plan gives it a slot.
"""

from __future__ import annotations

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control.actions import Action, AskPool, Record, SendToNode, StartLocalSpare
from torchrelay.control.protocol import StartSpare
from torchrelay.control.state import GONE, JobState, Member, MemberState, Role
from torchrelay.control.verdicts import missing_spares


def spare_accounted(job: JobState, node: str) -> None:
    """A spare launched on ``node`` joined or exited: it is no longer on its way."""
    job.spares_launching[node] = max(0, job.spares_launching.get(node, 0) - 1)


def start_spare(job: JobState) -> list[Action]:
    """Start a spare on the live node that runs the fewest processes (local on ties)."""
    local = [] if job.local_node is None else [job.local_node]
    live = local + [n for n, e in job.nodes.items() if e.alive]

    def load(node: str) -> int:
        return sum(1 for m in job.members.values() if m.node == node and m.state not in GONE)

    node = min(live, key=lambda n: (load(n), n != job.local_node))
    job.spares_launching[node] = job.spares_launching.get(node, 0) + 1
    if node == job.local_node:
        return [StartLocalSpare()]
    return [SendToNode(node, StartSpare())]


def ready_spares(job: JobState) -> list[Member]:
    return [
        m for m in job.members.values() if m.role is Role.SPARE and m.state is MemberState.READY
    ]


def in_sight(job: JobState) -> tuple[int, int, int]:
    """Spares (ready, starting, launching) that no slot holds yet."""
    free = [m for m in job.members.values() if m.role is Role.SPARE and m.slot is None]
    return (
        sum(1 for m in free if m.state is MemberState.READY),
        sum(1 for m in free if m.state is MemberState.STARTING),
        sum(job.spares_launching.values()),
    )


def top_up(job: JobState, config: JobConfig, needed: int) -> list[Action]:
    """Keep ``--spares`` spares ready or on their way, more while a recovery needs more
    (several slots failed at once); a job started with ``--spares 0`` gets none."""
    actions: list[Action] = []
    if config.spares > 0:
        for _ in range(max(needed, config.spares) - sum(in_sight(job))):
            actions += start_spare(job)
    elif config.pool is not None:
        # Idle pool slots are every job's spares: ask for the ones still missing.
        missing = needed - sum(in_sight(job)) - job.pool_asked
        if missing > 0:
            job.pool_asked += missing
            actions.append(AskPool(missing))
            actions.append(Record(events.PoolAsked(slots=missing, pool=config.pool.address)))
    return actions


def none_will_come(job: JobState, needed: int) -> bool:
    """Fewer than ``needed`` spares are ready, starting, launching or asked of the pool."""
    ready, starting, launching = in_sight(job)
    return missing_spares(needed, ready, starting, launching + job.pool_asked)
