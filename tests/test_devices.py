"""Device selection (runtime/devices.py): ``TORCHRELAY_DEVICE`` and the communicator that goes
with a device. Runs without a GPU: the CUDA cases check what is decided, not CUDA itself."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from torchrelay.runtime.devices import DeviceError, new_group, select_device, shared_gpu
from torchrelay.runtime.guard import StepGuard

TIMEOUT = datetime.timedelta(seconds=30)


@pytest.mark.parametrize(
    ("value", "expected"), [("", None), ("cpu", None), ("cuda:0", 0), ("cuda:3", 3)]
)
def test_shared_gpu_reads_the_variable(monkeypatch, value, expected) -> None:
    monkeypatch.setenv("TORCHRELAY_DEVICE", value)
    assert shared_gpu() == expected


@pytest.mark.parametrize("value", ["gpu", "cuda", "cuda:", "cuda:x", "cuda:-1", "tpu:0"])
def test_a_bad_value_is_one_line_naming_the_choices(monkeypatch, value) -> None:
    monkeypatch.setenv("TORCHRELAY_DEVICE", value)
    with pytest.raises(DeviceError, match=r"use cpu, or cuda:N") as raised:
        select_device(0)
    assert "\n" not in str(raised.value)


def test_cpu_is_forced_and_is_the_default_without_cuda(monkeypatch) -> None:
    monkeypatch.setenv("TORCHRELAY_DEVICE", "cpu")
    assert select_device(5) == torch.device("cpu")
    monkeypatch.delenv("TORCHRELAY_DEVICE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device(5) == torch.device("cpu")


def test_a_shared_gpu_without_cuda_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("TORCHRELAY_DEVICE", "cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="CUDA is not available"):
        select_device(1)


def test_every_process_takes_the_shared_gpu_whatever_its_local_index(monkeypatch) -> None:
    chosen: list[torch.device] = []
    monkeypatch.setenv("TORCHRELAY_DEVICE", "cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert [select_device(i) for i in (0, 2, 7)] == [torch.device("cuda", 1)] * 3
    assert chosen == [torch.device("cuda", 1)] * 3


def test_a_shared_gpu_is_reduced_over_gloo(monkeypatch) -> None:
    """NCCL refuses two ranks on one GPU: the shared GPU's communicator is gloo (built here
    for real, as a group of one; no CUDA is touched to decide it)."""
    monkeypatch.setenv("TORCHRELAY_DEVICE", "cuda:0")
    group = new_group(dist.HashStore(), 0, 1, TIMEOUT, torch.device("cuda", 0))
    assert group.name() == "gloo"
    monkeypatch.setenv("TORCHRELAY_DEVICE", "cpu")
    assert new_group(dist.HashStore(), 0, 1, TIMEOUT, torch.device("cpu")).name() == "gloo"


def test_a_bounded_rendezvous_gives_up_on_a_missing_member_and_keeps_the_collective_timeout():
    """A peer that never connects (one that died inside gloo's rendezvous) holds the others
    only ``connect_within``; the group that does form keeps ``timeout`` for its collectives."""
    cpu = torch.device("cpu")
    with pytest.raises(dist.DistStoreError, match=r"(?i)wait timeout"):
        new_group(dist.HashStore(), 0, 2, TIMEOUT, cpu, datetime.timedelta(seconds=0.2))
    group = new_group(dist.HashStore(), 0, 1, TIMEOUT, cpu, datetime.timedelta(seconds=0.2))
    assert group.options._timeout == TIMEOUT


def test_a_transfer_waits_its_own_timeout_not_the_rendezvous_bound():
    """Gloo bounds a send or receive with the timeout its constructor was given, which here
    bounds the rendezvous (a fifth of ``connect_within``: 0.1 s); a transfer's works are
    waited with the collective timeout instead."""
    store, groups = dist.HashStore(), {}

    def make(rank):
        cpu = torch.device("cpu")
        groups[rank] = new_group(store, rank, 2, TIMEOUT, cpu, datetime.timedelta(seconds=0.5))

    members = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for member in members:
        member.start()
    for member in members:
        member.join()
    received = torch.zeros(4)
    work = groups[0].recv([received], 1, 0)
    # The source sends 0.5 s later: at least five times the constructor's timeout.
    source = threading.Timer(0.5, lambda: groups[1].send([torch.ones(4)], 0, 0).wait(TIMEOUT))
    source.start()
    guard = StepGuard()
    guard.enter_generation(0)
    guard.wait_works([work], lambda _index: None, TIMEOUT)
    source.join()
    assert torch.equal(received, torch.ones(4))
