"""The NVML health source against a fake pynvml (tests/fake_nvml.py): every field mapped,
unsupported fields None, a missing library or driver disables it with one log line, Xid events
drained without blocking; and the fake's names checked against the real nvidia-ml-py."""

from __future__ import annotations

import sys

import pytest

from tests.fake_nvml import (
    CONSTANTS,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    REASONS,
    Driver,
    Gpu,
    fake_nvml,
)
from torchrelay.health.nvml import NvmlFailure, NvmlSource, cuda_order
from torchrelay.health.poller import HealthPoller
from torchrelay.health.readings import Reading, RecoveryAction, Source, Throttle


def source(driver: Driver, visible: str | None = None, **module) -> tuple[NvmlSource, list[str]]:
    lines: list[str] = []
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    nvml = fake_nvml(driver, **module)
    return NvmlSource("node3", nvml, lines.append, clock=lambda: 7.0, environ=environ), lines


def test_normal_readings_map_every_field():
    hot = Gpu(
        temperature=88,
        slowdown=91,
        reasons=REASONS["GpuIdle"] | REASONS["HwThermalSlowdown"] | REASONS["SwPowerCap"],
        ecc_volatile=2,
        ecc_aggregate=5,
        remapped=(3, 1, 1, 0),
        recovery=1,
    )
    nvml, lines = source(Driver([Gpu(), hot]))
    assert nvml.enabled and lines == []
    cool, warm = nvml.read()
    assert cool == Reading(
        node="node3",
        device=0,
        source=Source.NVML,
        t=7.0,
        temperature_c=60.0,
        slowdown_margin_c=30.0,
        ecc_volatile_uncorrected=0,
        ecc_aggregate_uncorrected=0,
        remapped_rows_pending=False,
        remapped_rows_failed=False,
        recovery_action=RecoveryAction.NONE,
    )
    assert warm.device == 1 and warm.temperature_c == 88.0 and warm.slowdown_margin_c == 3.0
    # Idle is not a fault and is dropped; the others, as a sorted set.
    assert warm.throttle == (Throttle.HW_THERMAL, Throttle.SW_POWER_CAP)
    assert (warm.ecc_volatile_uncorrected, warm.ecc_aggregate_uncorrected) == (2, 5)
    assert (warm.remapped_rows_pending, warm.remapped_rows_failed) == (True, False)
    assert warm.recovery_action is RecoveryAction.GPU_RESET
    assert Reading.from_wire(warm.to_wire()) == warm  # it travels as JSON


@pytest.mark.parametrize(
    "query, blank",
    [
        ("nvmlDeviceGetTemperature", ("temperature_c", "slowdown_margin_c")),
        ("nvmlDeviceGetTemperatureThreshold", ("slowdown_margin_c",)),
        ("nvmlDeviceGetTotalEccErrors", ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected")),
        ("nvmlDeviceGetRemappedRows", ("remapped_rows_pending", "remapped_rows_failed")),
        ("nvmlDeviceGetFieldValues", ("recovery_action",)),
    ],
)
@pytest.mark.parametrize(
    "code", [NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION, NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_a_field_the_gpu_does_not_support_is_none_and_the_others_stay(query, blank, code):
    nvml, lines = source(Driver([Gpu(temperature=70, fails={query: code})]))
    (reading,) = nvml.read()
    for name in blank:
        assert getattr(reading, name) is None, name
    assert reading.temperature_c in (None, 70.0)
    assert reading.ecc_volatile_uncorrected in (None, 0)
    assert reading.recovery_action in (None, RecoveryAction.NONE)
    assert lines == []


def test_unsupported_throttle_reasons_and_recovery_field_read_as_nothing():
    gpu = Gpu(reasons=REASONS["HwSlowdown"], recovery=None, fails={"reasons": 3})
    nvml, _ = source(Driver([gpu]))
    (reading,) = nvml.read()
    assert reading.throttle == () and reading.recovery_action is None


def test_an_older_pynvml_with_throttle_names_and_no_recovery_field():
    gpu = Gpu(reasons=REASONS["HwSlowdown"] | REASONS["SwThermalSlowdown"], recovery=2)
    nvml, _ = source(Driver([gpu]), event_names=False, recovery_field=False)
    (reading,) = nvml.read()
    assert reading.throttle == (Throttle.HW_SLOWDOWN, Throttle.SW_THERMAL)
    assert reading.recovery_action is None


def test_a_recovery_code_past_the_table_is_unknown_not_none():
    nvml, _ = source(Driver([Gpu(recovery=42)]))
    assert nvml.read()[0].recovery_action is RecoveryAction.UNKNOWN


@pytest.mark.parametrize(
    "code, says",
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_no_library_or_driver_disables_the_source_with_one_line(code, says):
    driver = Driver([Gpu()], init_error=code)
    nvml, lines = source(driver)
    assert not nvml.enabled
    assert nvml.read() == [] and nvml.read() == []
    assert len(lines) == 1 and says in lines[0] and "node3" in lines[0]


def test_no_gpu_disables_the_source_and_shuts_nvml_down():
    driver = Driver([])
    nvml, lines = source(driver)
    assert not nvml.enabled and nvml.read() == []
    assert lines == ["NVML source disabled: no GPU on node3"] and driver.shut_down


def test_no_pynvml_module_disables_the_source(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    lines: list[str] = []
    nvml = NvmlSource("node3", log=lines.append, environ={})
    assert not nvml.enabled and nvml.read() == []
    assert len(lines) == 1 and "nvidia-ml-py" in lines[0]


def test_xid_events_are_drained_without_blocking_onto_their_device():
    driver = Driver([Gpu(), Gpu()], xid=[(1, 79), (1, 48), (0, 13)])
    nvml, _ = source(driver)
    assert driver.registered == [0, 1]
    first = nvml.read()
    assert [r.xid for r in first] == [(13,), (79, 48)]
    assert set(driver.waits) == {0}  # a zero timeout: the poll never waits for an event
    driver.xid.append((0, 94))
    assert [r.xid for r in nvml.read()] == [(94,), ()]  # each event once


def test_a_device_without_xid_events_keeps_its_other_readings():
    driver = Driver([Gpu(fails={"nvmlDeviceRegisterEvents": NVML_ERROR_NOT_SUPPORTED}), Gpu()])
    nvml, lines = source(driver)
    assert driver.registered == [1] and lines == []
    driver.xid.append((1, 79))
    assert [r.xid for r in nvml.read()] == [(), (79,)]
    lonely, lonely_lines = source(Driver([driver.gpus[0]]))
    assert lonely.enabled and len(lonely_lines) == 1 and "Xid" in lonely_lines[0]
    assert lonely.read()[0].temperature_c == 60.0


def test_a_lost_gpu_is_a_reading_not_an_error():
    driver = Driver([Gpu(), Gpu(lost=True)])
    nvml, _ = source(driver)
    ok, lost = nvml.read()
    assert not ok.gpu_lost and lost.gpu_lost and lost.temperature_c is None


def test_a_driver_error_disables_the_source_in_the_poller_with_one_line():
    driver = Driver([Gpu(fails={"nvmlDeviceGetTemperature": NVML_ERROR_UNKNOWN})])
    nvml, _ = source(driver)
    with pytest.raises(NvmlFailure, match="nvmlDeviceGetTemperature: Unknown Error"):
        nvml.read()
    lines: list[str] = []
    delivered: list[list[Reading]] = []
    poller = HealthPoller([nvml], delivered.append, log=lines.append)
    poller.poll_once()
    poller.poll_once()
    assert delivered == [[], []] and poller.sources == []
    assert len(lines) == 1 and lines[0].startswith("nvml source disabled: NvmlFailure")
    assert driver.shut_down  # the disabled source was closed


def test_close_frees_nvml_and_reads_nothing_after():
    driver = Driver([Gpu()])
    nvml, _ = source(driver)
    nvml.close()
    assert driver.shut_down and nvml.read() == []


def test_the_fake_speaks_the_installed_pynvml():
    pynvml = pytest.importorskip("pynvml")
    fake = fake_nvml(Driver([]))
    for name, value in CONSTANTS.items():
        assert getattr(pynvml, name) == value, name
    for suffix, bit in REASONS.items():
        assert getattr(pynvml, f"nvmlClocksEventReason{suffix}") == bit
        assert getattr(pynvml, f"nvmlClocksThrottleReason{suffix}") == bit
    for name in dir(fake):
        if name.startswith("nvml"):
            assert callable(getattr(pynvml, name)) == callable(getattr(fake, name)), name
    assert issubclass(pynvml.NVMLError_NotSupported, pynvml.NVMLError)
    assert pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED).value == NVML_ERROR_NOT_SUPPORTED


def test_the_real_nvml_reads_every_gpu_or_disables_itself_with_one_line():
    pynvml = pytest.importorskip("pynvml")
    lines: list[str] = []
    nvml = NvmlSource("node0", nvml=pynvml, log=lines.append)  # this environment's devices
    try:
        if not nvml.enabled:  # no NVIDIA driver here
            assert len(lines) == 1 and lines[0].startswith("NVML source disabled")
            return
        readings = nvml.read()
        assert 0 < len(readings) <= pynvml.nvmlDeviceGetCount()
        assert [r.device for r in readings] == list(range(len(readings)))
        assert all(r.temperature_c is None or 0 < r.temperature_c < 130 for r in readings)
    finally:
        nvml.close()


def test_devices_are_numbered_as_cuda_numbers_them_under_cuda_visible_devices():
    gpus = [Gpu(temperature=50 + i) for i in range(4)]
    nvml, _ = source(Driver(gpus, xid=[(2, 79), (0, 48)]), visible=f"2,{gpus[0].uuid[:12]}")
    assert driver_temperatures(nvml.read()) == [(0, 52.0, (79,)), (1, 50.0, (48,))]
    assert cuda_order(None, 3, str) == [0, 1, 2]
    uuids = ["GPU-aa", "GPU-ab", "GPU-b"]
    assert cuda_order("1,GPU-b,7,0", 3, uuids.__getitem__) == [1, 2]  # stops at the bad one
    assert cuda_order("GPU-a", 3, uuids.__getitem__) == []  # ambiguous: names no one device
    assert cuda_order("0,0", 3, uuids.__getitem__) == [0]
    assert cuda_order("", 3, uuids.__getitem__) == []
    hidden, lines = source(Driver([Gpu()]), visible="")
    assert not hidden.enabled
    assert lines == ["NVML source disabled: no GPU on node3 (CUDA_VISIBLE_DEVICES='')"]


def driver_temperatures(readings: list[Reading]) -> list[tuple[int, float | None, tuple[int, ...]]]:
    return [(r.device, r.temperature_c, r.xid) for r in readings]
