"""The stable process group: local mode, real collectives, and aborts that never block."""

import threading

import torch
import torch.distributed as dist

from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard, guard_optimizer


def test_local_mode_answers_collectives_without_peers():
    facade = StableProcessGroup(4, StepGuard())
    t = torch.tensor([3.0])
    facade.allreduce([t]).wait()
    facade.broadcast([t]).wait()
    outs = [[torch.zeros(1) for _ in range(4)]]
    facade.allgather(outs, [t]).wait()
    assert t.item() == 3.0 and all(o.item() == 3.0 for o in outs[0])


def _bound(pg, rank):
    guard = StepGuard()
    facade = StableProcessGroup(2, guard)
    facade.bind(pg, rank, generation=0)
    guard.enter_generation(0)
    return facade, guard


def test_collectives_run_on_the_bound_group(ranks):
    def body(rank, pg):
        facade, guard = _bound(pg, rank)
        t = torch.tensor([float(rank + 1)])
        facade.allreduce([t]).wait()
        return t.item(), guard.poisoned

    assert ranks(2, body) == [(3.0, False), (3.0, False)]


def test_abort_releases_a_collective_whose_peer_never_comes(ranks):
    """Rank 1 never enters the all-reduce (as if stopped): rank 0 must not hang, and its
    tensor must keep its value even if the abandoned gloo work completes later."""
    entered, release = threading.Event(), threading.Event()

    def body(rank, pg):
        facade, guard = _bound(pg, rank)
        if rank == 1:
            entered.wait(10)
            release.wait(10)
            return None
        t = torch.tensor([5.0])
        work = facade.allreduce([t])
        entered.set()
        guard.abort(0)
        work.wait()
        release.set()
        return t.item(), guard.poisoned, guard.aborted

    value, poisoned, aborted = ranks(2, body, timeout=3.0)[0]
    assert value == 5.0 and poisoned and aborted


def test_collectives_after_abort_return_at_once_poisoned():
    guard = StepGuard()
    facade = StableProcessGroup(2, guard)
    facade.bind(object(), 0, generation=0)  # never touched: the generation is already aborted
    guard.enter_generation(3)
    guard.abort(3)
    t = torch.tensor([1.0])
    facade.allreduce([t]).wait()
    assert t.item() == 1.0 and guard.poisoned


def test_abort_of_another_generation_is_ignored():
    guard = StepGuard()
    guard.enter_generation(2)
    guard.abort(1)
    assert not guard.aborted and not guard.poisoned


def test_poisoned_step_skips_the_optimizer():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    guard = StepGuard()
    guard_optimizer(opt, guard)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    guard.begin_step()
    guard.poison("peer died")
    opt.step()
    assert torch.equal(model.weight, before) and not guard.optimizer_applied
    guard.begin_step()
    opt.step()
    assert not torch.equal(model.weight, before) and guard.optimizer_applied


def test_failed_peer_poisons_instead_of_raising(ranks):
    def body(rank, pg):
        facade, guard = _bound(pg, rank)
        if rank == 1:
            pg.allreduce([torch.ones(1)]).wait()
            return None
        # A size mismatch makes gloo fail the work on rank 0's side.
        t = torch.ones(3)
        try:
            facade.allreduce([t]).wait()
        except RuntimeError:
            return "raised"
        return guard.poisoned, t.tolist()

    result = ranks(2, body, timeout=5.0)[0]
    assert result in ("raised", (True, [1.0, 1.0, 1.0])) and result != "raised"


def test_facade_is_accepted_by_ddp_in_local_mode():
    facade = StableProcessGroup(3, StepGuard())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3), process_group=facade)
    assert isinstance(model.process_group, dist.ProcessGroup)
