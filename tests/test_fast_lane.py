"""The stable group's compiled fast lane (runtime/fast_lane.py, fast_lane.cpp): which collectives
it runs, that every change of the conditions it relies on sends collectives back to the Python
path, and, in two real processes, that it trains as plain DDP does and releases an aborted
collective without writing into the caller's buffer."""

from __future__ import annotations

import datetime
import multiprocessing
import time
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.conftest import require_built
from tests.gloo_pair import join_pair, plain_group, run_pair
from torchrelay.runtime import facade as facade_module
from torchrelay.runtime.devices import cuttable, new_group
from torchrelay.runtime.fast_lane import NativeStableProcessGroup, stable_group
from torchrelay.runtime.guard import NATIVE_SWITCH, StepGuard

TIMEOUT = datetime.timedelta(seconds=30)


@pytest.fixture
def group(monkeypatch) -> Iterator[NativeStableProcessGroup]:
    """A compiled stable group in a step, bound to a gloo group of one (taken as cuttable, as
    a job's groups of two or more are: only those run in place)."""
    require_built()
    monkeypatch.setattr(facade_module, "cuttable", lambda _group: True)
    guard = StepGuard()
    stable = stable_group(1, guard)
    assert isinstance(stable, NativeStableProcessGroup)
    stable.bind(_gloo_of_one(), 0, generation=0)
    guard.enter_generation(0)
    guard.begin_step()
    yield stable
    stable.unbind()


def _gloo_of_one() -> dist.ProcessGroup:
    return new_group(dist.HashStore(), 0, 1, TIMEOUT, torch.device("cpu"))


def _sum(stable: NativeStableProcessGroup, value: float = 1.0) -> torch.Tensor:
    tensor = torch.full((4,), value)
    stable.allreduce([tensor]).wait()
    return tensor


def test_the_first_collective_takes_the_python_path_and_arms_the_lane_for_the_rest(group):
    _sum(group)
    assert group.lane.launched == 0
    for _ in range(3):
        assert _sum(group, 2.0).tolist() == [2.0] * 4
    group.broadcast([torch.ones(2)]).wait()
    summed = torch.ones(3)
    dist.all_reduce(summed, group=group)  # ordinary torch.distributed calls take it too
    assert group.lane.launched == 5 and summed.tolist() == [1.0] * 3


def _shrink(stable: NativeStableProcessGroup) -> None:
    # Two ranks on the one member (hosting): an all-reduce must combine what was kept.
    stable.set_layout((0, 0))


CHANGES: dict[str, Callable[[NativeStableProcessGroup], object]] = {
    "a new generation's communicator": lambda g: g.bind(_gloo_of_one(), 0, generation=1),
    "the generation aborted": lambda g: g._guard.abort(0),
    "its communicator cut": lambda g: g.abort(0),
    "a new generation entered": lambda g: g._guard.enter_generation(1),
    "ranks hosted": _shrink,
    "a launch hook": lambda g: setattr(g, "after_allreduce_launch", lambda: None),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_change_of_its_conditions_sends_the_next_collective_to_python(group, change):
    _sum(group)
    _sum(group)
    assert group.lane.launched == 1
    CHANGES[change](group)
    group.allreduce([torch.ones(2)]).wait()
    assert group.lane.launched == 1


def test_a_local_block_is_answered_locally_although_the_lane_was_armed(group):
    _sum(group)
    with group.local():
        group.allreduce([torch.ones(2)]).wait()
    assert group.lane.launched == 0


def test_a_launch_hook_runs_for_every_all_reduce(group):
    calls: list[int] = []
    group.after_allreduce_launch = lambda: calls.append(1)
    for _ in range(3):
        _sum(group)
    assert len(calls) == 3 and group.lane.launched == 0
    group.after_allreduce_launch = None
    _sum(group)
    _sum(group)
    assert group.lane.launched == 1 and len(calls) == 3


def test_a_poisoned_step_launches_nothing_more_and_the_next_step_does(group):
    _sum(group)
    group._guard.poison("a failed collective")
    _sum(group)
    assert group.lane.launched == 0 and group._guard.poison_reason == "a failed collective"
    group._guard.begin_step()
    _sum(group)
    assert group.lane.launched == 1


def test_an_arm_from_state_read_before_a_disarm_fails(group):
    lane = group.lane
    epoch = lane.epoch
    lane.disarm()  # a condition changed after the caller read the epoch
    assert not lane.arm(group.inner, 0, epoch)
    assert lane.arm(group.inner, 0, lane.epoch)


def test_the_last_launch_is_stamped_on_either_path(group):
    before = time.monotonic()
    _sum(group)  # the Python path
    python_stamp = group.last_launch()
    _sum(group)  # the lane
    assert before <= python_stamp <= group.last_launch() <= time.monotonic()


def test_without_the_compiled_guard_the_group_is_the_python_one(monkeypatch):
    monkeypatch.setenv(NATIVE_SWITCH, "0")
    assert type(stable_group(2, StepGuard())).__name__ == "StableProcessGroup"


def _ddp_member(rank: int, port: int, results: multiprocessing.Queue) -> None:
    pair = join_pair(rank, port)
    models = []
    for process_group in (plain_group(pair.store, rank, 2), pair.facade):
        torch.manual_seed(0)
        model = DDP(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)),
            process_group=process_group,
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            pair.guard.begin_step()
            inputs = torch.Generator().manual_seed(step * 2 + rank)
            model(torch.randn(4, 8, generator=inputs)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        models.append(model)
    same = all(
        torch.equal(a, b)
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True)
    )
    results.put((rank, same, pair.guard.poisoned, pair.facade.lane.launched))
    pair.store.set(f"done{rank}", "1")
    pair.store.wait(["done0", "done1"])


@pytest.mark.timeout(120)
def test_ddp_through_the_lane_trains_bitwise_as_plain_ddp():
    require_built()
    for rank, same, poisoned, launched in run_pair(_ddp_member, reports=2):
        assert same and not poisoned, rank
        assert launched >= 5, rank  # every step's all-reduces but the first arming one


def _aborted_member(rank: int, port: int, results: multiprocessing.Queue) -> None:
    pair = join_pair(rank, port)
    guard, facade = pair.guard, pair.facade
    for _ in range(2):
        facade.allreduce([torch.ones(4)]).wait()
    if rank == 1:  # a peer that never enters the next all-reduce
        pair.store.wait(["aborted"])
        pair.store.set("left", "1")
        return
    buffer = torch.full((1 << 16,), 5.0)
    launched = facade.lane.launched
    work = facade.allreduce([buffer])
    waited = guard.oldest_wait()
    guard.abort(0)  # what the runtime does when the controller aborts the generation
    cut = not cuttable(pair.inner)  # by the lane's release, not by any later timeout
    work.wait()
    results.put(
        (
            facade.lane.launched - launched,
            cut,
            waited is not None,
            guard.oldest_wait(),
            buffer.unique().tolist(),
            guard.poison_reason or "",
        )
    )
    pair.store.set("aborted", "1")
    pair.store.wait(["left"])


@pytest.mark.timeout(120)
def test_an_aborted_collective_of_the_lane_is_released_untouched():
    require_built()
    (report,) = run_pair(_aborted_member, reports=1)
    ran_in_lane, cut, was_pending, pending_after, values, reason = report
    assert ran_in_lane == 1 and cut and was_pending and pending_after is None
    assert values == [5.0] and "aborted" in reason
