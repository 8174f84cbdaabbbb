"""Quarantine as plain data (add, clear, what spares may use), its owner-only file, and the
operator's commands: `torchrelay uncordon` and `torchrelay chaos overheat`, through the real
entry point, without torch."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.jobs import cli
from tests.test_cli_imports import probe
from torchrelay.health.inject import injection_path
from torchrelay.health.quarantine import (
    Quarantine,
    Quarantined,
    QuarantineError,
    cleared,
    load,
    quarantined,
    save,
    update,
    usable,
)

HOT = Quarantined(node="node1", device=2, reason="temperature 95 C >= 90 C", t=100.0)
NODE = Quarantined(node="node3", reason="the node's agent was lost", t=200.0)
DEVICES = [("node1", d) for d in range(4)] + [("node3", 0), ("node3", 1)]


def test_usable_leaves_out_quarantined_devices_and_nodes():
    assert usable(DEVICES, Quarantine()) == DEVICES
    held = quarantined(quarantined(Quarantine(), HOT), NODE)
    assert usable(DEVICES, held) == [("node1", 0), ("node1", 1), ("node1", 3)]
    assert held.holds("node3", 7) and not held.holds("node1", 3)


def test_quarantining_again_replaces_and_clearing_removes_one_entry():
    later = Quarantined(node="node1", device=2, reason="critical Xid 79", t=150.0)
    held = quarantined(quarantined(quarantined(Quarantine(), HOT), NODE), later)
    assert held.entries == (NODE, later)
    assert cleared(held, "node1", 2).entries == (NODE,)
    assert cleared(held, "node3", None).entries == (later,)


def test_clearing_what_is_not_quarantined_is_one_line_listing_what_is():
    held = quarantined(Quarantine(), HOT)
    with pytest.raises(QuarantineError, match=r"^node1 device 3 is not quarantined "):
        cleared(held, "node1", 3)
    with pytest.raises(QuarantineError, match=r"\(quarantined: node1 device 2\)$"):
        cleared(held, "node1", None)  # a device's entry is not the node's
    with pytest.raises(QuarantineError, match=r"\(quarantined: nothing\)$"):
        cleared(Quarantine(), "node0", 0)


def test_the_quarantine_persists_owner_only(tmp_path):
    assert load(tmp_path) == Quarantine()
    held = quarantined(quarantined(Quarantine(), HOT), NODE)
    save(tmp_path, held)
    assert load(tmp_path) == held
    assert os.stat(tmp_path / "quarantine.json").st_mode & 0o777 == 0o600
    assert json.loads((tmp_path / "quarantine.json").read_text())[1] == {
        "node": "node3",
        "device": None,
        "reason": "the node's agent was lost",
        "t": 200.0,
    }
    assert sorted(os.listdir(tmp_path)) == ["quarantine.json"]  # no temporary file left


@pytest.mark.parametrize(
    "text, mode, says",
    [
        ("{", 0o600, "cannot read"),
        ('{"node": "node1"}', 0o600, "expected a JSON list of entries"),
        ('[{"node": "node1", "device": -1, "reason": "x", "t": 1}]', 0o600, "device -1"),
        ('[{"node": "node1", "device": 1, "t": 1}]', 0o600, "missing field 'reason'"),
        ("[]", 0o666, "is open to others"),
    ],
)
def test_a_bad_quarantine_file_is_one_line(tmp_path, text, mode, says):
    path = tmp_path / "quarantine.json"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(QuarantineError) as caught:
        load(tmp_path)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_concurrent_updates_lose_nothing(tmp_path):
    def add(node: int) -> None:
        for device in range(10):
            entry = Quarantined(node=f"node{node}", device=device, reason="hot", t=1.0)
            update(tmp_path, lambda q, e=entry: quarantined(q, e))

    threads = [threading.Thread(target=add, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(load(tmp_path).entries) == 40


def test_an_update_that_raises_writes_nothing(tmp_path):
    save(tmp_path, quarantined(Quarantine(), HOT))
    with pytest.raises(QuarantineError):
        update(tmp_path, lambda q: cleared(q, "node9", 0))
    assert load(tmp_path).entries == (HOT,)


def test_uncordon_through_the_command_line(tmp_path):
    save(tmp_path, quarantined(quarantined(Quarantine(), HOT), NODE))
    done = cli("uncordon", "--run-dir", str(tmp_path), "--node", "1", "--device", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "uncordoned node1 device 2; 1 quarantined left\n"
    assert load(tmp_path).entries == (NODE,)
    again = cli("uncordon", "--run-dir", str(tmp_path), "--node", "1", "--device", "2")
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == (
        "torchrelay uncordon: node1 device 2 is not quarantined (quarantined: node3)\n"
    )
    nowhere = cli("uncordon", "--run-dir", str(tmp_path / "absent"), "--node", "1")
    assert nowhere.returncode == 1 and nowhere.stderr.count("\n") == 1
    assert probe("uncordon", "--run-dir", str(tmp_path), "--node", "3") == {
        "code": 0,
        "torch": False,
    }
    assert load(tmp_path) == Quarantine()


def test_chaos_overheat_a_device_with_no_job(tmp_path):
    done = cli("chaos", "--run-dir", str(tmp_path), "overheat", "--node", "2", "--device", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("overheat: device 1 on node2 reads 95 C from now on")
    path = injection_path(tmp_path, "node2")
    assert json.loads(path.read_text()) == [{"device": 1, "temperature_c": 95.0}]
    assert os.stat(path).st_mode & 0o777 == 0o600
    for argv, says in [
        (("--node", "2"), "--node needs --device"),
        (("--node", "2", "--device", "-1"), "device -1 is not a device index"),
    ]:
        bad = cli("chaos", "--run-dir", str(tmp_path), "overheat", *argv)
        assert bad.returncode == 1 and says in bad.stderr and bad.stderr.count("\n") == 1
    hotter = ("overheat", "--node", "2", "--device", "1", "--celsius", "101")
    assert probe("chaos", "--run-dir", str(tmp_path), *hotter) == {"code": 0, "torch": False}
    assert json.loads(path.read_text()) == [{"device": 1, "temperature_c": 101.0}]


def test_chaos_overheat_a_rank_of_a_running_job(live_job):
    run_dir = live_job.run_dir
    drill = ("chaos", "--run-dir", str(run_dir), "overheat", "--rank", "0", "--celsius", "97")
    assert probe(*drill) == {"code": 0, "torch": False}
    entries = json.loads(injection_path(run_dir, "node0").read_text())
    assert entries == [{"process": "worker0", "slot": 0, "temperature_c": 97.0}]
    missing = cli("chaos", "--run-dir", str(run_dir), "overheat", "--rank", "5")
    assert missing.returncode == 1
    assert missing.stderr == "torchrelay chaos overheat: no rank 5 (world size 1)\n"
