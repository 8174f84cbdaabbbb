"""The injection source and the poller: injected readings follow their process, an untrusted
or malformed file is ignored after one log line, a failing source is disabled once."""

from __future__ import annotations

import json
import os
import threading

import pytest

from torchrelay.health.files import UntrustedFile, read_owned
from torchrelay.health.inject import InjectionError, InjectionSource, inject, injection_path
from torchrelay.health.poller import HealthPoller, node_sources
from torchrelay.health.readings import Reading, Source, Throttle

DEVICES = {"worker2": 1, "spare0": 3}


def source(run_dir, lines: list[str]) -> InjectionSource:
    return InjectionSource(run_dir, "node1", DEVICES.get, log=lines.append, clock=lambda: 4.0)


def test_an_injection_reads_back_at_every_poll_until_the_file_goes(tmp_path):
    lines: list[str] = []
    injected = source(tmp_path, lines)
    assert injected.read() == []
    path = inject(tmp_path, "node1", {"process": "worker2", "slot": 2, "temperature_c": 95})
    assert path == tmp_path / "health" / "node1.json"
    assert os.stat(path).st_mode & 0o777 == 0o600
    inject(tmp_path, "node1", {"device": 0, "throttle": ["hw_thermal"], "xid": [79]})
    expected = [
        Reading(
            node="node1",
            device=1,
            source=Source.INJECTED,
            t=4.0,
            slot=2,
            process="worker2",
            temperature_c=95.0,
        ),
        Reading(
            node="node1",
            device=0,
            source=Source.INJECTED,
            t=4.0,
            throttle=(Throttle.HW_THERMAL,),
            xid=(79,),
        ),
    ]
    assert injected.read() == expected and injected.read() == expected
    path.unlink()
    assert injected.read() == [] and lines == []


def test_a_new_injection_for_the_same_target_replaces_the_old(tmp_path):
    inject(tmp_path, "node1", {"process": "worker2", "temperature_c": 95})
    inject(tmp_path, "node1", {"process": "worker2", "temperature_c": 97})
    inject(tmp_path, "node1", {"device": 1, "temperature_c": 50})
    entries = json.loads(injection_path(tmp_path, "node1").read_text())
    assert entries == [
        {"process": "worker2", "temperature_c": 97},
        {"device": 1, "temperature_c": 50},
    ]


def test_an_injection_for_a_process_that_is_gone_is_skipped_with_one_line(tmp_path):
    lines: list[str] = []
    injected = source(tmp_path, lines)
    inject(tmp_path, "node1", {"process": "worker5", "temperature_c": 95})
    inject(tmp_path, "node1", {"process": "spare0", "temperature_c": 95})
    for _ in range(3):
        assert [r.device for r in injected.read()] == [3]
    assert lines == ["injection for worker5 ignored: no such process on node1"]


@pytest.mark.parametrize(
    "text, says",
    [
        ("{", "not JSON"),
        ('{"device": 0, "temprature_c": 95}', "unknown key 'temprature_c'"),
        ('{"temperature_c": 95}', "names neither a device nor a process"),
        ('{"device": -1}', "device -1 is not a device index"),
        ('{"device": 0, "temperature_c": "hot"}', "temperature_c 'hot' is not a float"),
        ("[3]", "an entry is int, not a JSON object"),
    ],
)
def test_a_malformed_file_is_ignored_with_one_line_not_one_per_poll(tmp_path, text, says):
    lines: list[str] = []
    injected = source(tmp_path, lines)
    path = injection_path(tmp_path, "node1")
    path.parent.mkdir()
    path.write_text(text)
    path.chmod(0o600)
    for _ in range(3):
        assert injected.read() == []
    assert len(lines) == 1 and says in lines[0] and str(path) in lines[0]
    with pytest.raises(InjectionError, match="cannot add to"):
        inject(tmp_path, "node1", {"device": 0, "temperature_c": 95})


def test_a_file_others_could_write_or_a_symlink_is_not_trusted(tmp_path):
    lines: list[str] = []
    injected = source(tmp_path, lines)
    path = inject(tmp_path, "node1", {"device": 0, "temperature_c": 95})
    path.chmod(0o644)
    assert injected.read() == []
    assert len(lines) == 1 and "is open to others (mode 644)" in lines[0]
    elsewhere = tmp_path / "elsewhere.json"
    path.rename(elsewhere)
    elsewhere.chmod(0o600)
    path.symlink_to(elsewhere)
    assert injected.read() == []
    assert "is a symlink" in lines[-1]
    with pytest.raises(UntrustedFile):
        read_owned(path)


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"device": 0, "temperature": 95}, "unknown key 'temperature'"),
        ({"slot": 2, "temperature_c": 95}, "names neither a device nor a process"),
    ],
)
def test_inject_refuses_a_bad_entry_and_writes_nothing(tmp_path, entry, says):
    with pytest.raises(InjectionError, match=says):
        inject(tmp_path, "node1", entry)
    assert not injection_path(tmp_path, "node1").exists()


class Broken:
    name = "broken"

    def __init__(self) -> None:
        self.reads = 0
        self.closed = False

    def read(self) -> list[Reading]:
        self.reads += 1
        raise OSError("the sensor went away")

    def close(self) -> None:
        self.closed = True


def test_the_poller_delivers_every_source_and_disables_a_failing_one_once(tmp_path):
    lines: list[str] = []
    inject(tmp_path, "node1", {"device": 0, "temperature_c": 95})
    broken = Broken()
    delivered: list[list[Reading]] = []
    poller = HealthPoller([broken, source(tmp_path, lines)], delivered.append, log=lines.append)
    for _ in range(3):
        poller.poll_once()
    assert [[r.temperature_c for r in batch] for batch in delivered] == [[95.0]] * 3
    assert broken.reads == 1 and broken.closed and [s.name for s in poller.sources] == ["injected"]
    assert lines == ["broken source disabled: OSError: the sensor went away"]


def test_the_poller_thread_polls_until_stopped_and_stop_wakes_it(tmp_path):
    inject(tmp_path, "node1", {"device": 0, "temperature_c": 95})
    batches: list[list[Reading]] = []
    third = threading.Event()

    def deliver(readings: list[Reading]) -> None:
        batches.append(readings)
        if len(batches) == 3:
            third.set()

    poller = HealthPoller([source(tmp_path, [])], deliver, interval=0.01)
    poller.start()
    assert third.wait(timeout=60)
    assert all(batch[0].temperature_c == 95.0 for batch in batches)
    slow = HealthPoller([source(tmp_path, [])], deliver, interval=3600)
    slow.start()
    poller.stop()
    slow.stop()  # wakes it from its hour-long wait: it does not time out the join
    assert not poller._thread.is_alive() and not slow._thread.is_alive()


def test_the_poller_stops_loudly_when_delivering_fails(tmp_path):
    lines: list[str] = []
    said = threading.Event()

    def log(line: str) -> None:
        lines.append(line)
        said.set()

    def deliver(readings: list[Reading]) -> None:
        raise RuntimeError("controller gone")

    poller = HealthPoller([source(tmp_path, [])], deliver, interval=0.01, log=log)
    poller.start()
    assert said.wait(timeout=60)
    poller._thread.join(timeout=60)
    assert not poller._thread.is_alive()
    assert lines == [
        "health poller stopped: delivering readings failed: RuntimeError('controller gone')"
    ]


def test_a_poll_interval_must_be_positive():
    with pytest.raises(ValueError, match="not a positive duration"):
        HealthPoller([], lambda readings: None, interval=0)


def test_a_nodes_sources_are_nvml_and_its_injection_file(tmp_path):
    lines: list[str] = []
    sources = node_sources(tmp_path, "node1", DEVICES.get, log=lines.append)
    assert [s.name for s in sources] == ["nvml", "injected"]
    inject(tmp_path, "node1", {"process": "worker2", "temperature_c": 95})
    poller = HealthPoller(sources, lambda readings: None, log=lines.append)
    injected = [r for r in poller.poll_once() if r.source is Source.INJECTED]
    assert [(r.device, r.temperature_c) for r in injected] == [(1, 95.0)]
    poller.stop()
