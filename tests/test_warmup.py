"""A spare warms its optimizers while it waits (runtime/warmup.py): the optimizer has run once,
and every bit of the state is what it was (the trajectory cannot tell)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from torchrelay.runtime.ddp import fix_buckets
from torchrelay.runtime.facade import StableProcessGroup
from torchrelay.runtime.guard import StepGuard
from torchrelay.runtime.warmup import (
    dummy_inputs,
    signature_of,
    warm_ddp,
    warm_model,
    warm_optimizer,
)


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


class _Stateful(torch.nn.Module):
    """Dropout (RNG), batch norm (running stats, a counter) and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.drop = torch.nn.Dropout(0.5)
        self.head = torch.nn.Linear(8, 2)
        self.register_buffer("calls", torch.zeros(()), persistent=False)

    def forward(self, tokens: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"out": self.head(self.drop(self.norm(self.embed(tokens)))) * scale}


def test_a_signature_is_the_shapes_and_dtypes_of_tensor_arguments_only():
    tokens, scale = torch.zeros(4, dtype=torch.long), torch.ones(())
    signature = signature_of((tokens,), {"scale": scale})
    assert signature == {
        "args": [{"shape": [4], "dtype": "int64"}],
        "kwargs": {"scale": {"shape": [], "dtype": "float32"}},
    }
    args, kwargs = dummy_inputs(signature, torch.device("cpu"))
    assert args[0].dtype == torch.long and args[0].shape == (4,) and not args[0].any()
    assert kwargs["scale"].shape == ()
    assert signature_of((tokens, 3), {}) is None  # a number: nothing to make up
    assert signature_of((), {}) is None
    for bad in (
        {"args": [{"shape": [2], "dtype": "os.system"}], "kwargs": {}},
        {"args": [{"shape": [1 << 20, 1 << 20], "dtype": "float32"}], "kwargs": {}},
        {"args": [{"shape": [-3], "dtype": "float32"}], "kwargs": {}},
        {"args": "x"},
    ):
        with pytest.raises(ValueError):
            dummy_inputs(bad, torch.device("cpu"))


def test_warming_the_model_leaves_parameters_buffers_rng_and_gradients_as_they_were():
    torch.manual_seed(3)
    model = _Stateful()
    before = [t.clone() for t in [*model.parameters(), *model.buffers()]]
    rng = torch.get_rng_state()
    signature = signature_of((torch.zeros(4, dtype=torch.long),), {"scale": torch.ones(())})

    assert warm_model(model, signature, torch.device("cpu"))

    after = [*model.parameters(), *model.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


def test_a_model_that_cannot_take_the_signature_is_not_warmed_and_not_changed():
    model = _Stateful()
    before = [t.clone() for t in [*model.parameters(), *model.buffers()]]
    wrong = signature_of((torch.zeros(4, 3),), {})  # floats where token ids go: it raises
    assert not warm_model(model, wrong, torch.device("cpu"))
    after = [*model.parameters(), *model.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(p.grad is None for p in model.parameters())


class CountingGroup(StableProcessGroup):
    """The stable group (no communicator: every collective answered locally), counting the
    all-reduces DDP's reducer sends it."""

    def __init__(self) -> None:
        super().__init__(2, StepGuard())
        self.allreduces = 0

    def allreduce(self, tensors, opts=None):
        self.allreduces += 1
        return super().allreduce(tensors, opts)


def _ddp(group: StableProcessGroup) -> DistributedDataParallel:
    torch.manual_seed(3)
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.Dropout(0.3),
        torch.nn.Linear(16, 2),
    )
    model = DistributedDataParallel(net, process_group=group)
    fix_buckets(model, group)
    return model


def test_a_ddp_pass_runs_the_reducer_locally_and_changes_nothing_a_step_computes():
    warm_group, cold_group = CountingGroup(), CountingGroup()
    warmed, cold = _ddp(warm_group), _ddp(cold_group)
    signature = signature_of((torch.randn(4, 8),), {})
    before = [t.clone() for t in [*warmed.parameters(), *warmed.buffers()]]
    rng = torch.get_rng_state()
    assert warm_ddp(warmed, warm_group, signature, torch.device("cpu"))
    assert warm_group.allreduces >= 1  # the reducer's backward ran, answered locally
    after = [*warmed.parameters(), *warmed.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(p.grad is None for p in warmed.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    for model in (warmed, cold):  # the first real step: the same bits with or without
        torch.manual_seed(11)
        model(torch.randn(4, 8)).square().sum().backward()
    for a, b in zip(warmed.parameters(), cold.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    assert all(torch.equal(a, b) for a, b in zip(warmed.buffers(), cold.buffers(), strict=True))
