"""Fault-injection schedule: parse ``--chaos`` specs into plain data.

A spec is ``ACTION:key=value:key=value``. Supported now:

- ``kill:rank=R:step=S`` -- SIGKILL the worker of slot ``R`` while it is inside step ``S``
  (during the forward pass of the tracked model).
- ``kill:rank=R:step=S:phase=backward`` -- the same, but while its gradient all-reduce is in
  flight, so its peers are mid-collective when it dies.

Each event fires at most once per job: the worker reports it to the controller right before
it kills itself, and replacements are never handed a fired event.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

PHASES = ("forward", "backward")
ACTIONS = ("kill",)


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
        )


def parse_chaos(spec: str, event_id: int) -> ChaosEvent:
    """Parse one spec such as ``kill:rank=2:step=10:phase=backward``."""
    usage = "expected ACTION:rank=R:step=S[:phase=forward|backward], e.g. kill:rank=1:step=10"
    action, *fields = spec.strip().split(":")
    if action not in ACTIONS:
        raise ChaosSpecError(f"chaos spec {spec!r}: unknown action {action!r}; {usage}")
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key not in ("rank", "step", "phase"):
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
    return ChaosEvent(id=event_id, action=action, rank=rank, step=step, phase=phase)


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
