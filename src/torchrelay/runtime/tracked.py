"""The registry of state that torchrelay carries from rank to rank.

Anything with ``state_dict()`` / ``load_state_dict()`` can be tracked: modules, optimizers,
LR schedulers, gradient scalers, user objects. Modules and optimizers are protected by the step
guard (a poisoned step never applies the optimizer); the rest is small, so it is snapshotted at
every step boundary and restored when a step is dropped -- an LR scheduler stepped inside a
dropped step would otherwise run one step ahead.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class TrackingError(TypeError):
    """An object that cannot be tracked, with what to do about it."""


class TrackedState:
    """Named stateful objects of one worker."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}

    def add(self, name: str, obj: Any) -> None:
        if not (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ):
            raise TrackingError(
                f"cannot track {name}={type(obj).__name__}: it needs state_dict() and "
                "load_state_dict() methods"
            )
        if name in self.objects and self.objects[name] is not obj:
            raise TrackingError(f"{name!r} is already tracked (names must be unique)")
        self.objects[name] = obj

    def modules(self) -> list[torch.nn.Module]:
        return [o for o in self.objects.values() if isinstance(o, torch.nn.Module)]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in self.objects.values() if isinstance(o, torch.optim.Optimizer)]

    def state(self) -> dict[str, Any]:
        """Live state dicts (tensors are shared, not copied)."""
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load(self, state: dict[str, Any], own: dict[str, Any]) -> None:
        """Load received ``state``; modules whose tensors were received in place are skipped."""
        missing = set(self.objects) - set(state)
        if missing:
            raise TrackingError(f"received state lacks tracked object(s) {sorted(missing)}")
        for name, obj in self.objects.items():
            if isinstance(obj, torch.nn.Module) and _shares_storage(state[name], own[name]):
                continue
            obj.load_state_dict(state[name])

    def snapshot(self) -> dict[str, Any]:
        """Copy of everything a dropped step may have changed besides weights and moments."""
        snap: dict[str, Any] = {}
        for name, obj in self.objects.items():
            if isinstance(obj, torch.optim.Optimizer):
                snap[name] = [
                    {k: _copied(v) for k, v in group.items() if k != "params"}
                    for group in obj.param_groups
                ]
            elif not isinstance(obj, torch.nn.Module):
                snap[name] = copy.deepcopy(obj.state_dict())
        return snap

    def restore(self, snap: dict[str, Any]) -> None:
        for name, saved in snap.items():
            obj = self.objects[name]
            if isinstance(obj, torch.optim.Optimizer):
                for group, values in zip(obj.param_groups, saved, strict=True):
                    group.update(copy.deepcopy(values))
            else:
                obj.load_state_dict(copy.deepcopy(saved))


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


def _copied(value: Any) -> Any:
    """``value`` itself where nothing can change it in place (a hyperparameter is usually a
    number, or a tuple of numbers), else a deep copy. ``copy.deepcopy`` of every value of
    every group cost 35 µs a step once the step's tensors had evicted it from the caches."""
    if type(value) in _IMMUTABLE or (
        type(value) is tuple and all(type(v) in _IMMUTABLE for v in value)
    ):
        return value
    return copy.deepcopy(value)


def _shares_storage(received: dict[str, Any], own: dict[str, Any]) -> bool:
    if received.keys() != own.keys():
        return False
    return all(
        isinstance(r, torch.Tensor) and isinstance(o, torch.Tensor) and r.data_ptr() == o.data_ptr()
        for r, o in ((received[k], own[k]) for k in received)
    )
