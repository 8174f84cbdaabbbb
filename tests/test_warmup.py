"""A spare warms its optimizers while it waits (runtime/warmup.py): the optimizer has run once,
and every bit of the state is what it was (the trajectory cannot tell)."""

from __future__ import annotations

import torch

from torchrelay.runtime.warmup import warm_optimizer


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    return model, opt, sched


def _train(model, opt, sched, steps: int) -> list[torch.Tensor]:
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_warming_leaves_every_bit_of_the_state_as_it_was():
    model, opt, sched = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    scheduler = sched.state_dict()
    ran = []
    opt.register_step_pre_hook(lambda *_: ran.append("hook"))

    assert warm_optimizer(opt)

    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert not opt.state
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups
    assert sched.state_dict() == scheduler
    assert ran == []  # the user's step hooks did not run


def test_a_warmed_optimizer_trains_bit_for_bit_like_a_cold_one():
    cold = _train(*_setup(), steps=6)
    model, opt, sched = _setup()
    assert warm_optimizer(opt)
    warm = _train(model, opt, sched, steps=6)
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))


def test_an_optimizer_with_state_or_gradients_is_left_alone():
    model, opt, sched = _setup()
    _train(model, opt, sched, steps=1)
    state = {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state.items()}
    assert not warm_optimizer(opt)
    assert all(torch.equal(opt.state[k][n], t) for k, v in state.items() for n, t in v.items())

    model, opt, _ = _setup()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    assert not warm_optimizer(opt)
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))


def test_an_optimizer_that_needs_a_closure_is_not_warmed_and_not_changed():
    model, _, _ = _setup()
    opt = torch.optim.LBFGS(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    assert not warm_optimizer(opt)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
