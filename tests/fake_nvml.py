"""A fake ``pynvml`` module for the NVML health source's tests: the names and constant values of
``nvidia-ml-py`` (test_health_nvml checks them against the installed package), over a few
scripted GPUs. Built per test by :func:`fake_nvml` and handed to ``NvmlSource(nvml=...)``."""

from __future__ import annotations

import types
import uuid
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
MESSAGES = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}
CONSTANTS = {
    "NVML_SUCCESS": NVML_SUCCESS,
    "NVML_ERROR_NOT_SUPPORTED": NVML_ERROR_NOT_SUPPORTED,
    "NVML_ERROR_NO_PERMISSION": NVML_ERROR_NO_PERMISSION,
    "NVML_ERROR_TIMEOUT": NVML_ERROR_TIMEOUT,
    "NVML_ERROR_FUNCTION_NOT_FOUND": NVML_ERROR_FUNCTION_NOT_FOUND,
    "NVML_ERROR_GPU_IS_LOST": NVML_ERROR_GPU_IS_LOST,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": 230,
    "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
    "nvmlEventTypeXidCriticalError": 0x8,
}
REASONS = {  # the clocks-event reason bits (also named nvmlClocksThrottleReason*)
    "GpuIdle": 0x1,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
}


class NVMLError(Exception):
    """As pynvml's: the error code in ``value``, its text as ``str()``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass(eq=False)  # a handle: compared by identity, as NVML's pointers are
class Gpu:
    """One scripted GPU: what each query answers; a query named in ``fails`` raises that
    code instead; ``lost`` makes every query answer GPU_IS_LOST."""

    temperature: int = 60
    slowdown: int = 90
    reasons: int = 0
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failed
    recovery: int | None = 0  # None: the field answers NotSupported
    fails: dict[str, int] = field(default_factory=dict)
    lost: bool = False
    uuid: str = field(default_factory=lambda: f"GPU-{uuid.uuid4()}")


@dataclass
class Driver:
    """The state behind one fake module: its GPUs, pending Xid events, what was called."""

    gpus: list[Gpu]
    init_error: int | None = None
    xid: list[tuple[int, int]] = field(default_factory=list)  # (device index, Xid) pending
    registered: list[int] = field(default_factory=list)
    shut_down: bool = False
    waits: list[int] = field(default_factory=list)  # the timeouts nvmlEventSetWait_v2 got


def fake_nvml(driver: Driver, *, event_names: bool = True, recovery_field: bool = True) -> Any:
    """A module with pynvml's names over ``driver``. ``event_names`` False: an older pynvml
    that names the reasons nvmlClocksThrottleReason* only; ``recovery_field`` False: one too
    old to name NVML_FI_DEV_GET_GPU_RECOVERY_ACTION."""
    nv = types.ModuleType("fake_pynvml")
    nv.__dict__.update(CONSTANTS)
    if not recovery_field:
        del nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    nv.NVMLError = NVMLError
    for suffix, bit in REASONS.items():
        setattr(nv, f"nvmlClocksThrottleReason{suffix}", bit)
        if event_names:
            setattr(nv, f"nvmlClocksEventReason{suffix}", bit)

    def ask(handle: Gpu, name: str, answer: Any) -> Any:
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if name in handle.fails:
            raise NVMLError(handle.fails[name])
        return answer

    def init() -> None:
        if driver.init_error is not None:
            raise NVMLError(driver.init_error)

    def shutdown() -> None:
        driver.shut_down = True

    def temperature(handle: Gpu, sensor: int) -> int:
        assert sensor == nv.NVML_TEMPERATURE_GPU
        return ask(handle, "nvmlDeviceGetTemperature", handle.temperature)

    def threshold(handle: Gpu, which: int) -> int:
        assert which == nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return ask(handle, "nvmlDeviceGetTemperatureThreshold", handle.slowdown)

    def reasons(handle: Gpu) -> int:
        return ask(handle, "reasons", handle.reasons)

    def ecc(handle: Gpu, error_type: int, counter: int) -> int:
        assert error_type == nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        count = handle.ecc_volatile if counter == nv.NVML_VOLATILE_ECC else handle.ecc_aggregate
        return ask(handle, "nvmlDeviceGetTotalEccErrors", count)

    def remapped(handle: Gpu) -> tuple[int, int, int, int]:
        return ask(handle, "nvmlDeviceGetRemappedRows", handle.remapped)

    def field_values(handle: Gpu, ids: list[int]) -> list[Any]:
        ask(handle, "nvmlDeviceGetFieldValues", None)
        assert ids == [230]
        code = NVML_ERROR_NOT_SUPPORTED if handle.recovery is None else NVML_SUCCESS
        value = types.SimpleNamespace(uiVal=handle.recovery or 0)
        return [types.SimpleNamespace(fieldId=230, nvmlReturn=code, valueType=1, value=value)]

    def register(handle: Gpu, types_mask: int, events: object) -> None:
        assert types_mask == nv.nvmlEventTypeXidCriticalError and events == "event-set"
        ask(handle, "nvmlDeviceRegisterEvents", None)
        driver.registered.append(driver.gpus.index(handle))

    def wait(events: object, timeout_ms: int) -> Any:
        driver.waits.append(timeout_ms)
        if not driver.xid:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        index, xid = driver.xid.pop(0)
        return types.SimpleNamespace(
            device=driver.gpus[index], eventType=nv.nvmlEventTypeXidCriticalError, eventData=xid
        )

    functions = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(driver.gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: driver.gpus[i],
        "nvmlDeviceGetIndex": driver.gpus.index,
        "nvmlDeviceGetUUID": lambda handle: ask(handle, "nvmlDeviceGetUUID", handle.uuid),
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetTemperatureThreshold": threshold,
        "nvmlDeviceGetCurrentClocksThrottleReasons": reasons,
        "nvmlDeviceGetTotalEccErrors": ecc,
        "nvmlDeviceGetRemappedRows": remapped,
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlEventSetCreate": lambda: "event-set",
        "nvmlDeviceRegisterEvents": register,
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": lambda events: None,
    }
    if event_names:
        functions["nvmlDeviceGetCurrentClocksEventReasons"] = reasons
    for name, function in functions.items():
        if not isinstance(function, types.BuiltinMethodType):
            function.__name__ = name
        setattr(nv, name, function)
    return nv
