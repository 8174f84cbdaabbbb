"""The heartbeat lease (client side) and the partition drill's safety checks."""

from __future__ import annotations

import threading

import pytest

from torchrelay.agent import partition
from torchrelay.control.client import ControlError
from torchrelay.control.lease import keep_alive


def test_lease_expires_once_no_heartbeat_gets_through():
    beats: list[str] = []
    errors: list[str] = []
    expired: list[tuple[float, float]] = []

    def beat() -> float:
        if len(beats) < 2:
            beats.append("ok")
            return 1.0
        beats.append("lost")
        raise ControlError("DEADLINE_EXCEEDED", "no answer")

    keep_alive(
        beat,
        threading.Event(),
        lambda e: errors.append(e.code),
        lambda silence, lease, _: expired.append((silence, lease)),
    )
    ((silence, lease),) = expired
    assert lease == 1.0 and silence > lease
    assert beats[:2] == ["ok", "ok"] and set(errors) == {"DEADLINE_EXCEEDED"}


def test_no_lease_no_expiry_and_stop_ends_the_loop():
    stop = threading.Event()
    calls: list[int] = []

    def beat() -> None:
        calls.append(1)
        if len(calls) == 3:
            stop.set()
        raise ControlError("UNAVAILABLE", "down")

    keep_alive(beat, stop, lambda _: None, lambda *_: pytest.fail("expired without a lease"))
    assert len(calls) == 3


def test_partition_refuses_a_node_that_shares_the_controllers_host():
    with pytest.raises(partition.PartitionError, match="loopback"):
        partition.check_cuttable("127.0.0.1:29500")
    with pytest.raises(partition.PartitionError, match="loopback"):
        partition.check_cuttable("localhost:29500")


def test_partition_never_cuts_loopback():
    assert "lo" not in partition.interfaces()
