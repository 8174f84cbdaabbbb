"""Flatten nested state (state dicts) into a JSON schema plus a list of tensors, and back.

The schema can describe dicts (string, int, float, bool or None keys), lists, tuples, None,
bools, numbers, strings and tensors -- and nothing else, so it can never execute code when it
is read. Every tensor leaf carries its path, dtype, shape and device type (``cpu`` or ``cuda``),
so a receiver can match it with a tensor it already holds and receive in place, or allocate a
missing one where the sender keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_TENSOR, _TUPLE, _DICT = "__tensor__", "__tuple__", "__dict__"
_KEY_TYPES = (str, int, float, bool, type(None))
_SCALARS = (str, int, float, bool, type(None))
DEVICE_TYPES = ("cpu", "cuda")

Path = tuple[Any, ...]


class SchemaError(ValueError):
    """State that cannot be described by the schema, or a schema that is malformed."""


@dataclass(frozen=True)
class TensorSpec:
    """Where a tensor sits in the state, and what it is."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str = "cpu"

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * torch.empty((), dtype=self.dtype).element_size()

    def to_json(self) -> dict[str, Any]:
        return {
            "path": list(self.path),
            "dtype": str(self.dtype),
            "shape": list(self.shape),
            "device": self.device,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        device = data.get("device", "cpu")
        if device not in DEVICE_TYPES:
            raise SchemaError(f"unknown device type {device!r} in state schema")
        return cls(tuple(data["path"]), parse_dtype(data["dtype"]), tuple(data["shape"]), device)


def parse_dtype(name: str) -> torch.dtype:
    """``"torch.float32"`` -> ``torch.float32``; anything that is not a dtype is refused."""
    attr = name.removeprefix("torch.")
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise SchemaError(f"unknown dtype {name!r} in state schema")
    return dtype


def flatten(state: Any) -> tuple[Any, list[torch.Tensor], list[TensorSpec]]:
    """Return ``(tree, tensors, specs)``: a JSON-able tree with tensor placeholders."""
    tensors: list[torch.Tensor] = []
    specs: list[TensorSpec] = []

    def walk(value: Any, path: Path) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type not in DEVICE_TYPES:
                raise SchemaError(
                    f"cannot transfer a tensor on {value.device} at {'/'.join(map(str, path))}: "
                    f"only {DEVICE_TYPES} tensors"
                )
            specs.append(TensorSpec(path, value.dtype, tuple(value.shape), value.device.type))
            tensors.append(value)
            return {_TENSOR: len(tensors) - 1}
        if isinstance(value, dict):
            items = []
            for key, item in value.items():
                if not isinstance(key, _KEY_TYPES):
                    raise SchemaError(f"state key {key!r} at {path} is not a plain value")
                items.append([key, walk(item, (*path, key))])
            return {_DICT: items}
        if isinstance(value, tuple):
            return {_TUPLE: [walk(item, (*path, i)) for i, item in enumerate(value)]}
        if isinstance(value, list):
            return [walk(item, (*path, i)) for i, item in enumerate(value)]
        if isinstance(value, _SCALARS):
            return value
        raise SchemaError(
            f"cannot transfer a {type(value).__name__} at {'/'.join(map(str, path))}: state "
            "must be tensors, numbers, strings, None and containers of them"
        )

    return walk(state, ()), tensors, specs


def unflatten(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """Rebuild the nested state from ``tree`` with ``tensors`` in the placeholders."""
    if isinstance(tree, list):
        return [unflatten(item, tensors) for item in tree]
    if isinstance(tree, dict):
        if set(tree) == {_TENSOR}:
            index = tree[_TENSOR]
            if not isinstance(index, int) or not 0 <= index < len(tensors):
                raise SchemaError(f"tensor placeholder {index!r} out of range")
            return tensors[index]
        if set(tree) == {_TUPLE}:
            return tuple(unflatten(item, tensors) for item in tree[_TUPLE])
        if set(tree) == {_DICT}:
            return {key: unflatten(item, tensors) for key, item in tree[_DICT]}
        raise SchemaError(f"malformed schema node with keys {sorted(tree)}")
    if isinstance(tree, _SCALARS):
        return tree
    raise SchemaError(f"malformed schema value of type {type(tree).__name__}")


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a contiguous tensor (0-d included) sharing its storage."""
    if not tensor.is_contiguous():
        raise SchemaError("only contiguous tensors can be transferred in place")
    return tensor.reshape(-1).view(torch.uint8)
