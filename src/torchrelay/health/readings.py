"""What a health source saw on one device at one poll: a :class:`Reading`, plain data.

Every measurement is optional: ``None`` means the source could not tell (NVML answers
``NotSupported`` for that field on this GPU, or an injected reading leaves it out), never
"fine". A reading crosses the wire as JSON (``to_wire`` / ``from_wire`` over
:class:`torchrelay.typed.Plain`), so a node agent can carry its readings to the controller in a
node report; ``from_wire`` raises :class:`ReadingError` with one line naming the bad field.

Imports neither torch nor NVML.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torchrelay.typed import OMIT, Plain, at_least, optional

DEVICE = "a device index (an integer >= 0)"
COUNT = "a count (an integer >= 0)"


class ReadingError(ValueError):
    """A reading that does not parse; the message says which field, in one line."""


class Named(str, enum.Enum):
    """An enumeration whose members are their names on the wire and in messages."""

    def __str__(self) -> str:
        return str(self.value)


class Source(Named):
    """Who produced a reading."""

    NVML = "nvml"
    INJECTED = "injected"


class Throttle(Named):
    """Why the driver holds the clocks down (NVML's clocks-event / throttle reason bits).

    Only the reasons that say something about the device's health or its power and cooling
    are kept; idle, application clocks, sync boost and display clocks are not faults.
    """

    SW_POWER_CAP = "sw_power_cap"  # at the power limit: normal under a heavy load
    HW_SLOWDOWN = "hw_slowdown"  # hardware slowdown (thermal or power brake), clocks halved
    SW_THERMAL = "sw_thermal"  # the driver slows down to keep the temperature in range
    HW_THERMAL = "hw_thermal"  # the hardware slows down: it is too hot
    HW_POWER_BRAKE = "hw_power_brake"  # an external power brake (the power supply) asserted


class RecoveryAction(Named):
    """What the driver says the device needs (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``,
    ``nvmlDeviceGpuRecoveryAction_t``); ``UNKNOWN``: a code this build does not know,
    which still means the driver wants something done."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    BUS_RESET = "bus_reset"
    SYSTEM_REBOOT = "system_reboot"
    UNKNOWN = "unknown"


# nvmlDeviceGpuRecoveryAction_t, by its code.
RECOVERY_CODES = (
    RecoveryAction.NONE,
    RecoveryAction.GPU_RESET,
    RecoveryAction.NODE_REBOOT,
    RecoveryAction.DRAIN_P2P,
    RecoveryAction.DRAIN_AND_RESET,
    RecoveryAction.RECOVER_IMEX_DOMAIN,
    RecoveryAction.BUS_RESET,
    RecoveryAction.SYSTEM_REBOOT,
)


def recovery_action(code: int) -> RecoveryAction:
    """The action of a driver's code (``UNKNOWN`` for one past this build's table)."""
    return RECOVERY_CODES[code] if 0 <= code < len(RECOVERY_CODES) else RecoveryAction.UNKNOWN


def _count() -> Any:
    return at_least(0, COUNT, default=None, omit=True)


@dataclass(frozen=True, kw_only=True)
class Reading(Plain):
    """One device of one node at time ``t`` (the poller's clock, seconds since the epoch).

    ``slot`` and ``process`` name what runs on the device when the reader knows it.
    ``slowdown_margin_c`` is the slowdown threshold minus the temperature (how far from the
    driver halving the clocks); ``xid`` the Xid events the driver posted since the previous
    poll; ``gpu_lost`` that the driver answered "GPU is lost" (fallen off the bus).
    ``throttle`` is kept sorted and without repeats: a set, in a stable order on the wire.
    """

    ERROR: ClassVar[type[Exception]] = ReadingError

    node: str
    device: int = at_least(0, DEVICE)
    source: Source
    t: float
    slot: int | None = at_least(0, "a slot (an integer >= 0)", default=None, omit=True)
    process: str | None = optional()
    temperature_c: float | None = optional()
    slowdown_margin_c: float | None = optional()
    throttle: tuple[Throttle, ...] = ()
    ecc_volatile_uncorrected: int | None = _count()
    ecc_aggregate_uncorrected: int | None = _count()
    remapped_rows_pending: bool | None = optional()
    remapped_rows_failed: bool | None = optional()
    recovery_action: RecoveryAction | None = field(default=None, metadata=OMIT)
    xid: tuple[int, ...] = ()
    gpu_lost: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "throttle", tuple(sorted(set(self.throttle))))

    @property
    def key(self) -> tuple[str, int]:
        """The device it is about: ``(node, device)``."""
        return (self.node, self.device)

    def to_wire(self) -> dict[str, Any]:
        return self.to_plain()

    @classmethod
    def from_wire(cls, wire: Any) -> Reading:
        return cls.from_plain(wire)
