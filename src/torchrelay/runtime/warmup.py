"""Warming a spare while it waits for a slot, its state left exactly as it was.

A spare's first step after it takes a slot is the first step its process ever runs: whatever
torch does once per process (the first call of each kernel, the optimizer's choice of kernels
and its lazily imported helpers, the allocator's first touch of gradient- and state-sized
memory) lands inside the recovery. So a spare runs, while it waits:

- :func:`warm_optimizer`: one step of every tracked optimizer on zero gradients, on a
  throwaway state;
- :func:`warm_model`: a forward and backward pass of the tracked model's inner module on zero
  inputs of the shapes and dtypes the workers' forward takes (:func:`signature_of`, published
  by rank 0 at its first step, sealed with the job token). The user's loop body is never run:
  its side effects are the user's.
- :func:`warm_ddp`: then the same pass through the DDP wrapper, with the stable process group
  answering locally, so that DDP's first iteration (its reducer's first backward: ~5 ms here
  on the small benchmark model, twice a later one) is not the recovery's first step.

Then every parameter and buffer is copied back from a snapshot, the optimizer's own state and
group settings are put back, the RNG state too, and the gradients are ``None`` again, so the
spare holds exactly what it held before (bitwise; the state transfer overwrites the tracked
state anyway). A warm-up that fails (a model that cannot take zeros, an optimizer that needs a
closure) is skipped, with the state put back all the same.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from torchrelay.runtime.facade import StableProcessGroup

MAX_WARM_ELEMENTS = 1 << 26  # a signature asking for more is not warmed (256 MB of float32)


def signature_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The shapes and dtypes of a forward call's arguments, as plain JSON; ``None`` unless
    every argument is a tensor (nothing else can be made up without the user's data)."""

    def spec(value: Any) -> dict[str, Any] | None:
        if not isinstance(value, torch.Tensor):
            return None
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}

    specs = [spec(a) for a in args]
    named = {k: spec(v) for k, v in kwargs.items()}
    if not specs + list(named.values()) or None in specs or None in named.values():
        return None
    return {"args": specs, "kwargs": named}


def dummy_inputs(
    signature: dict[str, Any], device: torch.device
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Zero tensors for a :func:`signature_of`; ``ValueError`` if it is malformed or too big."""

    def make(spec: Any) -> torch.Tensor:
        shape, dtype = spec["shape"], getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype) or not all(isinstance(n, int) for n in shape):
            raise ValueError(f"not a tensor spec: {spec!r}")
        return torch.zeros(shape, dtype=dtype, device=device)

    try:
        specs, named = list(signature["args"]), dict(signature["kwargs"])
        elements = sum(math.prod(s["shape"]) for s in [*specs, *named.values()])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an input signature: {exc}") from None
    if not 0 <= elements <= MAX_WARM_ELEMENTS:
        raise ValueError(f"{elements} input elements: not warmed")
    return [make(s) for s in specs], {k: make(s) for k, s in named.items()}


def warm_model(module: torch.nn.Module, signature: dict[str, Any], device: torch.device) -> bool:
    """Run ``module`` forward and backward on zeros shaped by ``signature`` and undo it;
    ``False`` if it was not run (gradients present, bad signature, the pass failed)."""
    params = list(module.parameters())
    if any(p.grad is not None for p in params):
        return False
    try:
        args, kwargs = dummy_inputs(signature, device)
    except ValueError:
        return False
    # Parameters and buffers, non-persistent ones too (a forward may update any of them).
    held = [*module.parameters(), *module.buffers()]
    saved = [t.detach().clone() for t in held]
    warmed = False
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            out = module(*args, **kwargs)
            floats = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
            if floats:
                sum(t.float().sum() for t in floats).backward()  # type: ignore[union-attr]
                warmed = True
    except Exception:  # any failure only means: not warmed
        warmed = False
    finally:
        with torch.no_grad():
            for tensor, value in zip(held, saved, strict=True):
                tensor.copy_(value)
        for p in params:
            p.grad = None
    return warmed


def warm_ddp(
    model: DistributedDataParallel,
    group: StableProcessGroup,
    signature: dict[str, Any],
    device: torch.device,
) -> bool:
    """:func:`warm_model` through ``model`` (a DDP over ``group``), every collective answered
    locally, so nothing is sent and no peer is needed. What the pass leaves in the reducer is
    what any iteration leaves (its bucket buffers are overwritten by the next backward);
    parameters, buffers, RNG and gradients are put back as :func:`warm_model` does."""
    with group.local():
        return warm_model(model, signature, device)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


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
