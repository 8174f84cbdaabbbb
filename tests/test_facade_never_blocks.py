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


def _bound(pg, rank, setting_up=False):
    guard = StepGuard()
    facade = StableProcessGroup(2, guard)
    facade.bind(pg, rank, generation=0)
    guard.enter_generation(0)
    if not setting_up:
        guard.begin_step()
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


def test_a_set_up_collective_the_abort_ends_is_answered_locally(ranks):
    """A peer lost while the job sets up (it never joins the all-gather): the abort answers
    the collective as a spare's would, and so are the set-up's collectives after it."""

    def body(rank, pg):
        facade, guard = _bound(pg, rank, setting_up=True)
        if rank == 1:
            return None
        outs = [[torch.zeros(2) for _ in range(2)]]
        work = facade.allgather(outs, [torch.tensor([7.0, 8.0])])
        guard.abort(0)
        work.wait()
        t = torch.tensor([5.0])
        facade.broadcast([t], dist.BroadcastOptions()).wait()
        return [o.tolist() for o in outs[0]], t.item()

    assert ranks(2, body, timeout=5.0)[0] == ([[7.0, 8.0], [7.0, 8.0]], 5.0)


def test_a_set_up_collective_that_fails_waits_for_the_abort(ranks):
    """Its failure (gloo's, before the controller's abort comes) releases nothing: the work
    completes only once the abort answers it locally, its tensor as it was."""
    failed = threading.Event()

    def body(rank, pg):
        facade, guard = _bound(pg, rank, setting_up=True)
        if rank == 1:
            # A size mismatch makes gloo fail the work on rank 0's side.
            pg.allreduce([torch.ones(1)]).wait()
            failed.wait(10)
            return None
        t = torch.ones(3)
        work = facade.allreduce([t])
        done = threading.Thread(target=work.wait, daemon=True)
        done.start()
        done.join(0.5)
        pending = done.is_alive()
        failed.set()
        guard.abort(0)
        work.wait()
        return pending, t.tolist()

    assert ranks(2, body, timeout=5.0)[0] == (True, [1.0, 1.0, 1.0])
