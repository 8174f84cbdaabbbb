"""Reading a scenario: settings layered as nested dicts (scenario preset < YAML file <
command line), then validated once against :mod:`params`' dataclasses, so an error always names
the dotted field it is about, e.g. ``live.coverage``.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from torchrelay.simulate import presets
from torchrelay.simulate.errors import ScenarioError
from torchrelay.simulate.params import Scenario


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``override``, recursing into mappings both sides have."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def scenario_from_dict(settings: Mapping[str, Any]) -> Scenario:
    """A validated Scenario from YAML-shaped settings; a ``preset`` key names a scenario
    preset the other keys override. Raises ``ScenarioError`` naming the bad field."""
    if not isinstance(settings, Mapping):
        raise ScenarioError(f"scenario: expected a mapping of sections, got {settings!r}")
    rest = dict(settings)
    name = rest.pop("preset", None)
    if name is not None:
        if not isinstance(name, str):
            raise ScenarioError(f"preset: expected a preset name, got {name!r}")
        rest = merge(presets.lookup(presets.SCENARIOS, "scenario", name).settings, rest)
    return _build(Scenario, rest, "")


def read_settings(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; unreadable or malformed files raise ``ScenarioError``
    with the line and column of the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read scenario file ({err.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ScenarioError(f"{path}: malformed YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping of sections at the top, got {data!r}")
    return data


def load_scenario(path: Path) -> Scenario:
    """The validated Scenario described by the YAML file at ``path``."""
    return scenario_from_dict(read_settings(path))


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def _build(cls: type, data: Any, where: str) -> Any:
    names = [f.name for f in fields(cls)]
    if not isinstance(data, Mapping):
        label = where or "scenario"
        raise ScenarioError(f"{label}: expected a mapping with keys {names}, got {data!r}")
    unknown = [key for key in data if key not in names]
    if unknown:
        raise ScenarioError(f"{_join(where, unknown[0])}: unknown key; valid keys: {names}")
    hints = typing.get_type_hints(cls)
    kwargs = {key: _coerce(hints[key], value, _join(where, key)) for key, value in data.items()}
    required = [f.name for f in fields(cls) if f.name not in kwargs and _is_required(f)]
    if required:
        raise ScenarioError(f"{where or 'scenario'}: missing required key(s) {required}")
    try:
        return cls(**kwargs)
    except ScenarioError as err:
        # Field validators only know their own name; add the path to it.
        raise ScenarioError(_join(where, str(err))) from None


def _is_required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(hint)
        if value is None and type(None) in arms:
            return None
        for arm in arms:
            if arm is not type(None) and _fits(arm, value):
                return _coerce(arm, value, where)
        wanted = " or ".join(_describe(arm) for arm in arms)
        raise ScenarioError(f"{where}: expected {wanted}, got {value!r}")
    if not _fits(hint, value):
        raise ScenarioError(f"{where}: expected {_describe(hint)}, got {value!r}")
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if is_dataclass(hint):
        return _build(hint, value, where)
    if hint is float:
        return float(value)
    if hint is int:
        return int(float(value))
    return value


def _fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` has the shape of ``hint`` (contents are checked when coerced)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin is tuple:
        return isinstance(value, (list, tuple))
    if is_dataclass(hint):
        return isinstance(value, Mapping)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _is_number(value) and float(value).is_integer()
    if hint is float:
        return _is_number(value)
    return isinstance(value, hint)


def _is_number(value: Any) -> bool:
    # YAML 1.1 reads "1e-4" (no dot) as a string, so numeric strings count as numbers.
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return False


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    if origin is tuple:
        return "a list"
    if is_dataclass(hint):
        return "a mapping"
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a name"}
    return names.get(hint, "null" if hint is type(None) else getattr(hint, "__name__", "?"))
