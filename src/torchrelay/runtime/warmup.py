"""Warming a spare while it waits for a slot, its state left exactly as it was.

A spare's first step after it takes a slot is the first step its process ever runs: whatever
torch does once per process (the optimizer's choice of kernels, its lazily imported helpers,
the allocator's first touch of state-sized memory) lands inside the recovery. What can be run
without the user's data is run before the spare reports ready: one step of every tracked
optimizer on zero gradients, on a throwaway state. Then every parameter is copied back from a
snapshot, the optimizer's own state and group settings are put back, and the gradients are
``None`` again, so the spare holds exactly what it held before (bitwise; the state transfer
overwrites it anyway).

The forward and backward passes are not warmed: they need the user's inputs, and running the
user's loop body once more would run its side effects too.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch


def _unhooked_step(optimizer: torch.optim.Optimizer) -> Any:
    """The optimizer class's own ``step``: without the instance wrappers (torchrelay's guard,
    a scheduler's call counter) and without the step hooks torch wraps around it."""
    step = type(optimizer).step
    return getattr(step, "__wrapped__", step)


def warm_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Run one step of ``optimizer`` on zero gradients and undo it; ``False`` if it was not
    run (it already has state, gradients, or a step that needs a closure or fails)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if optimizer.state or any(p.grad is not None for p in params):
        return False  # not a fresh spare's optimizer: leave it alone
    saved_params = [p.detach().clone() for p in params]
    saved_state = optimizer.state
    saved_groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    warmed = False
    try:
        optimizer.state = defaultdict(dict)  # what torch.optim.Optimizer starts with
        for p in params:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        with contextlib.suppress(Exception):  # e.g. LBFGS needs a closure: then not warmed
            _unhooked_step(optimizer)(optimizer)
            warmed = True
    finally:
        optimizer.state = saved_state
        for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
            group.update(saved)
        with torch.no_grad():
            for p, saved in zip(params, saved_params, strict=True):
                p.copy_(saved)
                p.grad = None
    return warmed
