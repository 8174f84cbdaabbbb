"""Fault-injection schedule: parse ``--chaos`` specs into plain data.

A spec is ``ACTION:key=value:key=value``. Supported now:

- ``kill:rank=R:step=S`` -- SIGKILL the worker of slot ``R`` while it is inside step ``S``
  (during the forward pass of the tracked model).
- ``kill:rank=R:step=S:phase=backward`` -- the same, but while its gradient all-reduce is in
  flight, so its peers are mid-collective when it dies.
- ``kill:rank=R:step=S:phase=transfer`` -- while it takes part (as source or receiver) in the
  state transfer of a recovery that resumes at step ``S``: a failure during recovery.
- ``kill:rank=R:step=S:phase=rendezvous`` -- in that recovery (for ``S`` = 0, also in the
  job's first generation), once it has met its peers on the store and before it connects:
  they wait in the communicator's rendezvous for it.
- ``hang:rank=R:step=S[:phase=...]`` -- SIGSTOP it instead: the process is alive but silent, its
  peers block in the collective; only hang detection can cure this.
- ``freeze:rank=R:step=S[:phase=...]`` -- it enters a C call that holds the GIL for good (a
  wait no signal ends): the process is alive, but none of its threads (heartbeats included)
  runs Python again.
- ``slow:rank=R:step=S:seconds=X`` -- from step ``S`` on, that rank computes ``X`` seconds
  longer per step (a straggler: degraded GPU, thermal throttling).
- ``stall:rank=R:step=S[:phase=...]`` -- its training thread blocks for good while its
  heartbeats go on (a deadlocked data loader, a stuck kernel): only the step-progress rule of
  the controller sees it.
- ``drop:rank=R:step=S`` -- from step ``S`` its communicator silently stops delivering: its
  collectives are never sent and never complete, every rank waits, every rank heartbeats (a
  collective that never returns). Cured by re-forming the communicator with the same members.

- ``kill-node:node=N:step=S`` and ``partition:node=N:step=S:seconds=X`` -- once the job reaches
  step ``S``, node ``N``'s agent SIGKILLs its whole node / cuts its network for ``X`` seconds
  (the same drills as ``torchrelay chaos kill-node|partition``).

Each event fires at most once per job: the worker reports it to the controller right before
it kills itself (the controller fires node faults itself), and replacements are never handed
a fired event.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

PHASES = ("forward", "backward", "transfer", "rendezvous")
PROCESS_ACTIONS = ("kill", "hang", "freeze", "slow", "stall", "drop")
NODE_ACTIONS = ("kill-node", "partition")
ACTIONS = PROCESS_ACTIONS + NODE_ACTIONS
USAGE = (
    "expected kill|hang|freeze|stall:rank=R:step=S[:phase=forward|backward|transfer|rendezvous], "
    "drop:rank=R:step=S, slow:rank=R:step=S:seconds=X, kill-node:node=N:step=S or "
    "partition:node=N:step=S:seconds=X; e.g. kill:rank=1:step=10"
)


class ChaosSpecError(ValueError):
    """A ``--chaos`` spec that cannot be understood; the message says how to write it."""


@dataclass(frozen=True)
class ChaosEvent:
    """One injected fault: ``action`` on the worker of ``rank`` inside ``step``, at ``phase``;
    or, for a node fault, on node ``node`` once the job reaches ``step`` (``rank`` is -1)."""

    id: int
    action: str
    rank: int
    step: int
    phase: str = "forward"
    seconds: float = 0.0
    node: int = -1

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ChaosEvent:
        return cls(
            id=int(data["id"]),  # type: ignore[arg-type]
            action=str(data["action"]),
            rank=int(data["rank"]),  # type: ignore[arg-type]
            step=int(data["step"]),  # type: ignore[arg-type]
            phase=str(data.get("phase", "forward")),
            seconds=float(data.get("seconds", 0.0)),  # type: ignore[arg-type]
            node=int(data.get("node", -1)),  # type: ignore[arg-type]
        )


def parse_chaos(spec: str, event_id: int) -> ChaosEvent:
    """Parse one spec such as ``kill:rank=2:step=10:phase=backward``."""
    action, *fields = spec.strip().split(":")
    if action not in ACTIONS:
        raise ChaosSpecError(f"chaos spec {spec!r}: unknown action {action!r}; {USAGE}")
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key not in ("rank", "node", "step", "phase", "seconds"):
            raise ChaosSpecError(f"chaos spec {spec!r}: bad field {field!r}; {USAGE}")
        values[key] = value
    target = "node" if action in NODE_ACTIONS else "rank"
    wrong = {"rank", "phase"} & values.keys() if target == "node" else {"node"} & values.keys()
    if wrong:
        raise ChaosSpecError(f"chaos spec {spec!r}: {action} takes {target}=, not {sorted(wrong)}")
    if target not in values or "step" not in values:
        raise ChaosSpecError(f"chaos spec {spec!r}: {target} and step are required; {USAGE}")
    try:
        where, step = int(values[target]), int(values["step"])
        seconds = float(values.get("seconds", "0"))
    except ValueError:
        raise ChaosSpecError(
            f"chaos spec {spec!r}: {target} and step must be integers, seconds a number"
        ) from None
    phase = values.get("phase", "forward")
    if phase not in PHASES:
        raise ChaosSpecError(f"chaos spec {spec!r}: phase must be one of {PHASES}")
    if where < 0 or step < 0:
        raise ChaosSpecError(f"chaos spec {spec!r}: {target} and step must be >= 0")
    if action == "drop" and phase != "forward":
        raise ChaosSpecError(f"chaos spec {spec!r}: drop takes no phase (it starts at the step)")
    if not math.isfinite(seconds):
        raise ChaosSpecError(f"chaos spec {spec!r}: seconds must be a finite number")
    if (action in ("slow", "partition")) != (seconds > 0):
        raise ChaosSpecError(
            f"chaos spec {spec!r}: seconds=X (> 0) goes with slow and partition, only"
        )
    if target == "node":
        return ChaosEvent(event_id, action, -1, step, seconds=seconds, node=where)
    return ChaosEvent(event_id, action, where, step, phase, seconds)


def parse_schedule(specs: list[str], world_size: int, nnodes: int = 1) -> list[ChaosEvent]:
    """Parse every ``--chaos`` flag; reject ranks and nodes outside the job, and node 0."""
    events = [parse_chaos(spec, i) for i, spec in enumerate(specs)]
    for event in events:
        if event.rank >= world_size:
            raise ChaosSpecError(
                f"chaos event {event.action}:rank={event.rank} targets a rank outside the job "
                f"(world size {world_size})"
            )
        if event.action in NODE_ACTIONS and not 0 < event.node < nnodes:
            raise ChaosSpecError(
                f"chaos event {event.action}:node={event.node}: node faults target nodes 1.."
                f"{nnodes - 1} (node 0 hosts the controller; this job has {nnodes} node(s))"
            )
    return events


def random_schedule(
    seed: int,
    failures: int,
    world_size: int,
    first_step: int,
    last_step: int,
    hangs: int = 0,
    during_recovery: int = 0,
    stalls: int = 0,
    drops: int = 0,
) -> list[str]:
    """A reproducible mix of faults for soak tests and drills, as ``--chaos`` specs.

    Picks distinct steps in ``[first_step, last_step]`` at least two apart (so a recovery
    completes before the next fault), then assigns classes: ``hangs`` SIGSTOPs, ``stalls``
    training threads blocked while heartbeats go on, ``drops`` collectives that never return,
    ``during_recovery`` pairs where a second rank dies in the transfer of the recovery caused
    by the first (both count as failures), and SIGKILLs in the forward or backward pass for the
    rest.
    """
    events = failures - during_recovery
    special = hangs + during_recovery + stalls + drops
    if world_size < 2 or events < 1 or special > events:
        raise ValueError("need world_size >= 2 and enough failures for the requested classes")
    rng = random.Random(seed)
    candidates = list(range(first_step, last_step + 1, 2))
    if len(candidates) < events:
        raise ValueError(f"{events} faults do not fit in steps {first_step}..{last_step}")
    steps = sorted(rng.sample(candidates, events))
    kinds = ["hang"] * hangs + ["pair"] * during_recovery + ["stall"] * stalls + ["drop"] * drops
    kinds += [rng.choice(["forward", "backward"]) for _ in range(events - len(kinds))]
    rng.shuffle(kinds)
    specs = []
    for step, kind in zip(steps, kinds, strict=True):
        rank = rng.randrange(world_size)
        if kind in ("hang", "stall", "drop"):
            specs.append(f"{kind}:rank={rank}:step={step}")
        elif kind == "pair":
            other = rng.choice([r for r in range(world_size) if r != rank])
            specs += [
                f"kill:rank={rank}:step={step}",
                f"kill:rank={other}:step={step}:phase=transfer",
            ]
        else:
            specs.append(f"kill:rank={rank}:step={step}:phase={kind}")
    return specs
