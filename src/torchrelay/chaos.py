"""Fault-injection schedule: parse ``--chaos`` specs into plain data.

A spec is ``ACTION:key=value:key=value``. Supported now:

- ``kill:rank=R:step=S`` -- SIGKILL the worker of slot ``R`` while it is inside step ``S``
  (during the forward pass of the tracked model).
- ``kill:rank=R:step=S:phase=backward`` -- the same, but while its gradient all-reduce is in
  flight, so its peers are mid-collective when it dies.
- ``kill:rank=R:step=S:phase=transfer`` -- while it takes part (as source or receiver) in the
  state transfer of a recovery that resumes at step ``S``: a failure during recovery.
- ``hang:rank=R:step=S[:phase=...]`` -- SIGSTOP it instead: the process is alive but silent, its
  peers block in the collective; only hang detection can cure this.
- ``slow:rank=R:step=S:seconds=X`` -- from step ``S`` on, that rank computes ``X`` seconds
  longer per step (a straggler: degraded GPU, thermal throttling).
- ``stall:rank=R:step=S[:phase=...]`` -- its training thread blocks for good while its
  heartbeats go on (a deadlocked data loader, a stuck kernel): only the step-progress rule of
  the controller sees it.
- ``drop:rank=R:step=S`` -- from step ``S`` its communicator silently stops delivering: its
  collectives are never sent and never complete, every rank waits, every rank heartbeats (a
  collective that never returns). Cured by re-forming the communicator with the same members.

Each event fires at most once per job: the worker reports it to the controller right before
it kills itself, and replacements are never handed a fired event.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

PHASES = ("forward", "backward", "transfer")
ACTIONS = ("kill", "hang", "slow", "stall", "drop")


class ChaosSpecError(ValueError):
    """A ``--chaos`` spec that cannot be understood; the message says how to write it."""


@dataclass(frozen=True)
class ChaosEvent:
    """One injected fault: ``action`` on the worker of ``rank`` inside ``step``, at ``phase``."""

    id: int
    action: str
    rank: int
    step: int
    phase: str = "forward"
    seconds: float = 0.0

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
        )


def parse_chaos(spec: str, event_id: int) -> ChaosEvent:
    """Parse one spec such as ``kill:rank=2:step=10:phase=backward``."""
    usage = (
        "expected kill|hang|stall:rank=R:step=S[:phase=forward|backward|transfer], "
        "drop:rank=R:step=S or slow:rank=R:step=S:seconds=X, e.g. kill:rank=1:step=10"
    )
    action, *fields = spec.strip().split(":")
    if action not in ACTIONS:
        raise ChaosSpecError(f"chaos spec {spec!r}: unknown action {action!r}; {usage}")
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key not in ("rank", "step", "phase", "seconds"):
            raise ChaosSpecError(f"chaos spec {spec!r}: bad field {field!r}; {usage}")
        values[key] = value
    if "rank" not in values or "step" not in values:
        raise ChaosSpecError(f"chaos spec {spec!r}: rank and step are required; {usage}")
    try:
        rank, step = int(values["rank"]), int(values["step"])
    except ValueError:
        raise ChaosSpecError(f"chaos spec {spec!r}: rank and step must be integers") from None
    phase = values.get("phase", "forward")
    if phase not in PHASES:
        raise ChaosSpecError(f"chaos spec {spec!r}: phase must be one of {PHASES}")
    if rank < 0 or step < 0:
        raise ChaosSpecError(f"chaos spec {spec!r}: rank and step must be >= 0")
    try:
        seconds = float(values.get("seconds", "0"))
    except ValueError:
        raise ChaosSpecError(f"chaos spec {spec!r}: seconds must be a number") from None
    if action == "drop" and phase != "forward":
        raise ChaosSpecError(f"chaos spec {spec!r}: drop takes no phase (it starts at the step)")
    if (action == "slow") != (seconds > 0):
        raise ChaosSpecError(f"chaos spec {spec!r}: seconds=X (> 0) goes with slow, only")
    return ChaosEvent(event_id, action, rank, step, phase, seconds)


def parse_schedule(specs: list[str], world_size: int) -> list[ChaosEvent]:
    """Parse every ``--chaos`` flag; reject ranks outside the job."""
    events = [parse_chaos(spec, i) for i, spec in enumerate(specs)]
    for event in events:
        if event.rank >= world_size:
            raise ChaosSpecError(
                f"chaos event kill:rank={event.rank} targets a rank outside the job "
                f"(world size {world_size})"
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
