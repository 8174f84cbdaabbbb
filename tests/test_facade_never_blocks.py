"""The stable process group: local mode, real collectives, and aborts that never block."""

import threading

import torch
import torch.distributed as dist
from torch.futures import Future

from torchrelay.runtime import facade as facade_module
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


def test_a_step_begun_after_an_abort_is_poisoned_and_skips_the_optimizer():
    """The abort lands between the step loop's look at ``aborted`` and ``begin_step()``
    (seen in soaks right after a recovery's transfer): the step's collectives are not sent,
    so its optimizer must not apply this rank's own gradients."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    guard = StepGuard()
    guard_optimizer(opt, guard)
    facade = StableProcessGroup(2, guard)
    facade.bind(object(), 0, generation=0)  # never touched: the generation is aborted
    guard.enter_generation(0)
    guard.abort(0)
    guard.begin_step()
    model(torch.ones(1, 2)).sum().backward()
    grad = model.weight.grad.clone()
    facade.allreduce([model.weight.grad]).wait()
    before = model.weight.detach().clone()
    opt.step()
    assert guard.poisoned and "aborted" in str(guard.poison_reason)
    assert torch.equal(model.weight, before) and not guard.optimizer_applied
    assert torch.equal(model.weight.grad, grad)


def test_an_abort_that_overtook_its_plan_poisons_the_generation_it_aborts():
    guard = StepGuard()
    guard.abort(4)  # the plan for generation 4 is not entered yet
    guard.enter_generation(4)
    guard.begin_step()
    assert guard.aborted and guard.poisoned
    guard.enter_generation(5)
    guard.begin_step()
    assert not guard.aborted and not guard.poisoned


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


class _Failed:
    """A work that has failed (a peer's connection reset)."""

    def get_future(self):
        future = Future()
        future.set_exception(RuntimeError("Connection closed by peer"))
        return future


class _Failing:
    """An inner group whose every collective fails."""

    def allreduce(self, tensors, opts):
        return _Failed()


def test_a_set_up_collective_that_fails_waits_for_the_abort():
    """Its failure (gloo's, before the controller's abort comes) releases nothing: the work
    completes only once the abort answers it locally, its tensor as it was."""
    facade, guard = _bound(_Failing(), 0, setting_up=True)
    t = torch.ones(3)
    work = facade.allreduce([t])
    assert not work.is_completed()
    guard.abort(0)
    work.wait()
    assert t.tolist() == [1.0, 1.0, 1.0]


def test_a_set_up_collective_failure_no_abort_follows_poisons(monkeypatch):
    """Ranks that disagree in set-up (no peer lost, so no abort comes): after the wait, the
    failure poisons as in a step, instead of holding DDP's constructor for good."""
    monkeypatch.setattr(facade_module, "SETUP_ABORT_WAIT_S", 0.05)
    facade, guard = _bound(_Failing(), 0, setting_up=True)
    t = torch.ones(3)
    facade.allreduce([t]).wait()
    assert t.tolist() == [1.0, 1.0, 1.0]
    reason = "collective failed: Connection closed by peer (in set-up, and no abort followed)"
    assert guard.poison_reason == reason
