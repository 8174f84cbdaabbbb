"""When a device is unhealthy: declarative thresholds, and what one reading breaks.

:class:`HealthPolicy` holds the thresholds, with defaults for data-centre GPUs (A100, H100,
H200: slowdown threshold around 85-95 C, ECC on, row remapping) -- see docs/health.md for why
each. :func:`findings` is a pure function of a policy and one :class:`Reading`: the rules it
breaks, each a :class:`Finding` that is either

* a ``WARNING`` (a level: hot, throttling, ECC counts, a remap pending) -- the judge acts on it
  only once it persists (hysteresis, :mod:`torchrelay.health.judge`), or
* a ``FAULT`` (the device is failing now: the GPU is lost, the driver asks for a recovery
  action, a row remap failed, a critical Xid) -- acted on at the first reading. Xid events are
  faults because they are one-shot events the driver already judged: there is no level to
  persist, and a noisy one would never repeat K polls in a row.

:func:`load_policy` reads a policy from a TOML or JSON file of the same keys; an unknown key or
a bad value raises :class:`PolicyError` with one line naming the file and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

from torchrelay.health.readings import Named, Reading, RecoveryAction, Throttle
from torchrelay.typed import Plain, at_least

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: JSON policies only
    tomllib = None  # type: ignore[assignment]

# Critical Xids (NVIDIA's Xid catalogue): 48 double-bit ECC error; 63/64 a row remap (page
# retirement) recorded / failed to record; 74 NVLink error; 79 fallen off the bus; 92 high
# single-bit ECC rate; 94/95 contained/uncontained ECC error; 119/120 GSP RPC timeout / GSP
# error. Left out: application faults (13, 31, 43: an illegal access, an MMU fault, a stopped
# kernel -- the same program would fault on any GPU) and 45 (the driver cleaning up after a
# killed process).
CRITICAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)
# Thermal and hardware slowdowns; not the software power cap, which a busy GPU hits normally.
SLOWDOWNS = (
    Throttle.HW_SLOWDOWN,
    Throttle.SW_THERMAL,
    Throttle.HW_THERMAL,
    Throttle.HW_POWER_BRAKE,
)


class PolicyError(ValueError):
    """A health policy that cannot be used; the message says why, in one line."""


class Severity(Named):
    WARNING = "warning"  # acted on after it persists (hysteresis)
    FAULT = "fault"  # acted on at once


@dataclass(frozen=True)
class Finding:
    severity: Severity
    reason: str  # one line for the ledger and the operator: what was read, against what


@dataclass(frozen=True, kw_only=True)
class HealthPolicy(Plain):
    """The thresholds (a reading beyond one is a finding) and the judge's pacing.

    ``max_ecc_aggregate_uncorrected`` is off (None) by default: the aggregate count is for the
    device's life, so a GPU repaired long ago would be flagged for ever.
    """

    ERROR: ClassVar[type[Exception]] = PolicyError
    TAG: ClassVar[str] = "health policy"

    max_temperature_c: float = 90.0
    min_slowdown_margin_c: float = 5.0
    throttle: tuple[Throttle, ...] = SLOWDOWNS
    max_ecc_volatile_uncorrected: int = at_least(0, "a count (an integer >= 0)", default=0)
    max_ecc_aggregate_uncorrected: int | None = at_least(
        0, "a count (an integer >= 0) or null", default=None
    )
    remap_pending: bool = True  # a row remap waiting for a reset is a warning
    critical_xids: tuple[int, ...] = CRITICAL_XIDS
    persist_polls: int = at_least(1, "a number of polls (an integer >= 1)", default=3)
    clear_polls: int = at_least(1, "a number of polls (an integer >= 1)", default=3)
    max_migrations: int = at_least(1, "a number of migrations (an integer >= 1)", default=1)
    window_seconds: float = at_least(0.0, "a duration in seconds (>= 0)", default=60.0)
    max_fraction: float = 0.25  # of the slots, migrating at once (at least one)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.max_fraction <= 1.0:
            self._refuse(f"max_fraction {self.max_fraction!r} is not a fraction in (0, 1]")

    def concurrent(self, world_size: int) -> int:
        """How many slots may be migrating at once in a job of ``world_size``."""
        return max(1, int(self.max_fraction * world_size))


def findings(policy: HealthPolicy, reading: Reading) -> list[Finding]:
    """Every rule of ``policy`` that ``reading`` breaks (``[]``: healthy, or nothing known)."""
    found: list[Finding] = []

    def fault(reason: str) -> None:
        found.append(Finding(Severity.FAULT, reason))

    def warn(reason: str) -> None:
        found.append(Finding(Severity.WARNING, reason))

    r, p = reading, policy
    if r.gpu_lost:
        fault("the GPU is lost (the driver answered GPU_IS_LOST)")
    if r.recovery_action not in (None, RecoveryAction.NONE):
        fault(f"the driver asks for recovery action {r.recovery_action}")
    if r.remapped_rows_failed:
        fault("a row remap failed (the memory cannot be repaired)")
    for xid in r.xid:
        if xid in p.critical_xids:
            fault(f"critical Xid {xid}")
    if r.temperature_c is not None and r.temperature_c >= p.max_temperature_c:
        warn(f"temperature {r.temperature_c:.0f} C >= {p.max_temperature_c:.0f} C")
    margin = r.slowdown_margin_c
    if margin is not None and margin <= p.min_slowdown_margin_c:
        warn(f"{margin:.0f} C from the slowdown threshold (<= {p.min_slowdown_margin_c:.0f} C)")
    slowed = [t for t in r.throttle if t in p.throttle]
    if slowed:
        warn(f"clocks held down: {', '.join(slowed)}")
    volatile = r.ecc_volatile_uncorrected
    if volatile is not None and volatile > p.max_ecc_volatile_uncorrected:
        warn(f"{volatile} uncorrected ECC errors since the driver loaded")
    aggregate, limit = r.ecc_aggregate_uncorrected, p.max_ecc_aggregate_uncorrected
    if aggregate is not None and limit is not None and aggregate > limit:
        warn(f"{aggregate} uncorrected ECC errors over the device's life (> {limit})")
    if r.remapped_rows_pending and p.remap_pending:
        warn("a row remap is pending (the device needs a reset)")
    return found


def load_policy(path: Path) -> HealthPolicy:
    """The policy in ``path`` (``.toml`` or ``.json``; keys as :class:`HealthPolicy`'s fields,
    defaults for those left out); raises :class:`PolicyError` with one line."""
    where = f"health policy {path}"
    if path.suffix not in (".toml", ".json"):
        raise PolicyError(f"{where}: expected a .toml or .json file")
    if path.suffix == ".toml" and tomllib is None:
        raise PolicyError(f"{where}: TOML needs Python 3.11 or later; write it as .json")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        plain = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise PolicyError(f"{where} does not parse: {exc}") from None
    if not isinstance(plain, dict):
        raise PolicyError(f"{where}: expected an object of thresholds")
    known = [f.name for f in fields(HealthPolicy)]
    unknown = sorted(set(plain) - set(known))
    if unknown:
        raise PolicyError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(known)})")
    try:
        return HealthPolicy.from_plain(plain)
    except PolicyError as exc:
        raise PolicyError(f"{where}: {str(exc).removeprefix('health policy: ')}") from None
