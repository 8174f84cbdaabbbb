"""The stable process group as torch.distributed's default group (in-process; every test
leaves c10d's world as it found it)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.utils.data import DistributedSampler

from torchrelay.runtime import default_group
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard


@pytest.fixture
def installed(monkeypatch):
    """A 1-rank stable group installed as the default group, and how to bind it."""
    for module in (dist, c10d):
        monkeypatch.setattr(module, "init_process_group", module.init_process_group)
    assert not dist.is_initialized()
    guard = StepGuard()
    guard.enter_generation(0)
    group = StableProcessGroup(1, guard)
    store = dist.HashStore()
    default_group.install(group, store)

    def bind() -> None:
        inner = dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=10))
        group.bind(inner, 0, 0)

    yield group, bind
    if dist.is_initialized():
        dist.destroy_process_group()


def test_plain_torch_distributed_code_runs_on_the_stable_group(installed):
    group, bind = installed
    bind()
    assert dist.is_initialized() and dist.get_backend() == "torchrelay"
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    sampler = DistributedSampler(list(range(10)))
    assert (sampler.rank, sampler.num_replicas) == (0, 1)
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.barrier()
    out = [torch.zeros(3)]
    dist.all_gather(out, t)
    assert torch.equal(out[0], torch.ones(3))
    assert group.inner is not None  # the collectives went through the facade to gloo


def test_a_spare_answers_rank_zero_and_collectives_locally(installed):
    assert dist.get_rank() == 0  # no slot yet: a local stand-in (see default_group's doc)
    t = torch.full((2,), 3.0)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), 3.0))


def test_init_process_group_after_init_does_nothing(installed):
    group, _ = installed
    dist.init_process_group("gloo", rank=0, world_size=1)
    c10d.init_process_group(backend="nccl")
    assert c10d._get_default_group() is group


def test_a_prebound_init_process_group_gets_the_advice(installed):
    original = dist.init_process_group.__wrapped__
    with pytest.raises(ValueError) as error:
        original("gloo")
    assert default_group.is_reinit_error(error.value)
    assert "remove the init_process_group" in default_group.REINIT_ADVICE


def test_destroy_process_group_unregisters_the_group_only(installed):
    group, bind = installed
    bind()
    dist.destroy_process_group()
    assert not dist.is_initialized()
    t = torch.ones(1)
    group.allreduce([t]).wait()  # the relay's own communicator lives on to the job's end
    assert torch.equal(t, torch.ones(1))


def test_install_refuses_a_default_group_the_script_made_first(installed):
    with pytest.raises(default_group.DefaultGroupError, match="remove the init_process_group"):
        default_group.install(StableProcessGroup(1, StepGuard()), dist.HashStore())
