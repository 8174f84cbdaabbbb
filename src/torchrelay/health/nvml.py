"""The NVML health source: what the NVIDIA driver says about each GPU of this node.

Reads, per device and poll, through ``nvidia-ml-py`` (``import pynvml``): the temperature and
its margin to the slowdown threshold, the clocks-event (throttle) reasons, the volatile and
aggregate uncorrected ECC counts, the remapped-rows flags, the driver's recovery action
(``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, where the driver has it) and the critical Xid events
posted since the previous poll (an event set polled with a zero timeout: never blocks).

Failure behaviour, so that a node without NVIDIA GPUs runs as before:

* no ``pynvml`` module, no NVML library, no driver, ``nvmlInit`` failing, or no GPU: the
  source is *disabled* (``enabled`` False, ``read`` returns ``[]``) after ONE log line;
* one field the GPU or driver does not support (``NotSupported``, ``NoPermission``,
  ``FunctionNotFound``, or a ``pynvml`` too old to name it): that field is ``None``;
* "GPU is lost" from any query: the device's reading says ``gpu_lost`` (a fault, not an error);
* any other NVML error in :meth:`NvmlSource.read` raises :class:`NvmlFailure`; the poller
  disables the source with one log line (:mod:`torchrelay.health.poller`).

The module is injected (``nvml=``) in tests: a fake with the same names.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from torchrelay.health.log import Log, log_stderr
from torchrelay.health.readings import Reading, RecoveryAction, Source, Throttle, recovery_action

# Xid events drained per poll at most: a driver posting without end cannot hold the poller.
MAX_EVENTS = 256
# The bits of each throttle reason: pynvml >= 12.535 names them nvmlClocksEventReason*, older
# ones nvmlClocksThrottleReason*; the values are the same.
THROTTLE_BITS = {
    Throttle.SW_POWER_CAP: "SwPowerCap",
    Throttle.HW_SLOWDOWN: "HwSlowdown",
    Throttle.SW_THERMAL: "SwThermalSlowdown",
    Throttle.HW_THERMAL: "HwThermalSlowdown",
    Throttle.HW_POWER_BRAKE: "HwPowerBrakeSlowdown",
}
# c_nvmlValue_t's member for each NVML_VALUE_TYPE_* (0 double, 1 uint, 2 ulong, 3 ulonglong,
# 4 slonglong, 5 sint, 6 ushort).
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class NvmlFailure(RuntimeError):
    """NVML failed in a way that is not about one field; the message says how, in one line."""


class _Lost(Exception):
    """The driver answered NVML_ERROR_GPU_IS_LOST."""


def _load_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def cuda_order(visible: str | None, count: int, uuid: Callable[[int], str]) -> list[int]:
    """The NVML indices of the devices CUDA numbers 0, 1, ... in a process started with
    ``CUDA_VISIBLE_DEVICES=visible`` (None: unset, every device in NVML's PCI order, which is
    CUDA's for identical GPUs); entries are indices or UUID prefixes (``GPU-8d2f...``), and
    like CUDA the list ends at the first entry that names no device. ``count`` devices in
    all; ``uuid(i)``: the UUID of NVML's device ``i``, asked only for an entry that is one.
    """
    if visible is None:
        return list(range(count))
    order: list[int] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < count:
            index = int(entry)
        else:
            named = [i for i in range(count) if entry and uuid(i).startswith(entry)]
            if len(named) != 1:
                break
            index = named[0]
        if index in order:
            break
        order.append(index)
    return order


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSource:
    """Readings of the GPUs of ``node`` this job's processes see, one :class:`Reading` per
    device and poll. A reading's ``device`` is the CUDA ordinal (``cuda:N``, what the agent
    hands out as ``LOCAL_RANK``), not NVML's index: the two differ under
    ``CUDA_VISIBLE_DEVICES`` (in ``environ``, the environment the workers inherit)."""

    name = "nvml"

    def __init__(
        self,
        node: str,
        nvml: ModuleType | None = None,
        log: Log = log_stderr,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.node = node
        self._log = log
        self._clock = clock
        self._handles: list[Any] = []  # by CUDA ordinal, the device index of the readings
        self._ordinal: dict[int, int] = {}  # NVML index -> CUDA ordinal
        self._events: Any = None
        self.enabled = False
        self._nvml = nvml if nvml is not None else _load_pynvml()
        if self._nvml is None:
            log("NVML source disabled: no pynvml module (pip install nvidia-ml-py)")
            return
        nv = self._nvml
        self._field_errors = {
            getattr(nv, name)
            for name in (
                "NVML_ERROR_NOT_SUPPORTED",
                "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_FUNCTION_NOT_FOUND",
            )
        }
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        try:
            nv.nvmlInit()
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            order = cuda_order(
                visible, len(handles), lambda i: _text(nv.nvmlDeviceGetUUID(handles[i]))
            )
        except nv.NVMLError as exc:
            log(f"NVML source disabled: {exc} (no NVIDIA driver or GPU usable on {node})")
            self._shutdown()  # if nvmlInit got that far
            return
        self._handles = [handles[i] for i in order]
        self._ordinal = {index: ordinal for ordinal, index in enumerate(order)}
        if not self._handles:
            shown = "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r})"
            log(f"NVML source disabled: no GPU on {node}{shown}")
            self._shutdown()
            return
        self.enabled = True
        self._events = self._watch_xid()

    # ------------------------------------------------------------------ reading
    def read(self) -> list[Reading]:
        """One reading per device (``[]`` while disabled); raises :class:`NvmlFailure`."""
        if not self.enabled:
            return []
        t = self._clock()
        xid = self._drain_xid()
        readings = []
        for index, handle in enumerate(self._handles):
            try:
                fields = self._fields(handle)
            except _Lost:
                fields = {"gpu_lost": True}
            readings.append(
                Reading(
                    node=self.node,
                    device=index,
                    source=Source.NVML,
                    t=t,
                    xid=tuple(xid.get(index, ())),
                    **fields,
                )
            )
        return readings

    def _fields(self, handle: Any) -> dict[str, Any]:
        nv = self._nvml
        temperature = self._ask(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        slowdown = self._ask(
            nv.nvmlDeviceGetTemperatureThreshold, handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
        uncorrected = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile = self._ask(
            nv.nvmlDeviceGetTotalEccErrors, handle, uncorrected, nv.NVML_VOLATILE_ECC
        )
        aggregate = self._ask(
            nv.nvmlDeviceGetTotalEccErrors, handle, uncorrected, nv.NVML_AGGREGATE_ECC
        )
        rows = self._ask(getattr(nv, "nvmlDeviceGetRemappedRows", None), handle)
        return {
            "temperature_c": None if temperature is None else float(temperature),
            "slowdown_margin_c": (
                None if None in (temperature, slowdown) else float(slowdown - temperature)
            ),
            "throttle": self._throttle(handle),
            "ecc_volatile_uncorrected": volatile,
            "ecc_aggregate_uncorrected": aggregate,
            "remapped_rows_pending": None if rows is None else bool(rows[2]),
            "remapped_rows_failed": None if rows is None else bool(rows[3]),
            "recovery_action": self._recovery_action(handle),
        }

    def _throttle(self, handle: Any) -> tuple[Throttle, ...]:
        nv = self._nvml
        query = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        mask = self._ask(query, handle)
        if mask is None:
            return ()
        reasons = []
        for reason, suffix in THROTTLE_BITS.items():
            bit = getattr(nv, f"nvmlClocksEventReason{suffix}", None)
            bit = bit if bit is not None else getattr(nv, f"nvmlClocksThrottleReason{suffix}", 0)
            if mask & bit:
                reasons.append(reason)
        return tuple(reasons)

    def _recovery_action(self, handle: Any) -> RecoveryAction | None:
        nv = self._nvml
        field = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        values = None if field is None else self._ask(nv.nvmlDeviceGetFieldValues, handle, [field])
        if not values or values[0].nvmlReturn != nv.NVML_SUCCESS:
            # Each field carries its own status; drivers before R565 answer NotSupported.
            return None
        value = values[0]
        return recovery_action(int(getattr(value.value, VALUE_MEMBERS[value.valueType])))

    def _ask(self, query: Callable[..., Any] | None, *args: Any) -> Any:
        """``query(*args)``, or ``None`` for a field this GPU, driver or pynvml lacks."""
        if query is None:
            return None
        nv = self._nvml
        try:
            return query(*args)
        except nv.NVMLError as exc:
            if exc.value in self._field_errors:
                return None
            if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise _Lost from None
            raise NvmlFailure(f"{query.__name__}: {exc}") from None

    # ------------------------------------------------------------------ Xid
    def _watch_xid(self) -> Any:
        """An event set for critical Xid events of every device that supports them."""
        nv = self._nvml
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self._log(f"NVML source: no Xid events on {self.node} ({exc})")
            return None
        watched = 0
        for handle in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
                watched += 1
            except nv.NVMLError:
                continue  # this device posts no Xid events (NotSupported): its other fields stay
        if watched:
            return events
        self._log(f"NVML source: no device of {self.node} posts Xid events")
        nv.nvmlEventSetFree(events)
        return None

    def _drain_xid(self) -> dict[int, list[int]]:
        """The Xid events waiting now, by device index (a zero timeout: never blocks)."""
        nv = self._nvml
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        for _ in range(MAX_EVENTS):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError as exc:
                if exc.value == nv.NVML_ERROR_TIMEOUT:
                    break  # no event waiting
                raise NvmlFailure(f"nvmlEventSetWait_v2: {exc}") from None
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                try:
                    index = nv.nvmlDeviceGetIndex(data.device)
                except nv.NVMLError as exc:
                    raise NvmlFailure(f"nvmlDeviceGetIndex: {exc}") from None
                if index in self._ordinal:  # only visible devices are registered
                    found.setdefault(self._ordinal[index], []).append(int(data.eventData))
        return found

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """Free the event set and shut NVML down; the source reads nothing after."""
        if self.enabled:
            self.enabled = False
            if self._events is not None:
                self._quietly(self._nvml.nvmlEventSetFree, self._events)
            self._shutdown()

    def _shutdown(self) -> None:
        self._quietly(self._nvml.nvmlShutdown)

    def _quietly(self, call: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(self._nvml.NVMLError):  # closing: nothing left to tell
            call(*args)
