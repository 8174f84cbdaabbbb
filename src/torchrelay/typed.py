"""Frozen dataclasses that cross a boundary as plain JSON: control messages, ledger events.

A :class:`Plain` subclass declares its fields with type hints (``int``, ``float``, ``str``,
``bool``, an :class:`enum.Enum` (its values on the wire), ``X | None``, ``tuple[X, ...]``,
``dict[str, X]``, ``Any``) and, where a number
has a floor, :func:`at_least`. :meth:`Plain.from_plain` checks every field of a decoded JSON
object against its hint and floor and raises the class's ``ERROR`` with one line naming the
message and the field; fields it does not know are ignored (a newer sender may add some).
:meth:`Plain.to_plain` gives the JSON object back: tuples as lists, and a field declared with
:func:`optional` left out while it is ``None`` (so the wire keeps the shape it had).

Imports neither torch nor the controller: workers and operators' tools load it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from typing import Any, ClassVar

MISSING = dataclasses.MISSING
OMIT = {"omit": True}
"""The metadata of a field left out of the JSON while it is ``None``."""


def optional() -> Any:
    """A field that defaults to ``None`` and is left out of the JSON while it is ``None``."""
    return dataclasses.field(default=None, metadata=OMIT)


def at_least(floor: float, what: str, default: Any = MISSING, omit: bool = False) -> Any:
    """A number field that must be ``>= floor`` (``what`` says so in the error)."""
    meta = {"floor": floor, "what": what, "omit": omit}
    return dataclasses.field(default=default, metadata=meta)


STEP = "a step number (an integer >= -1)"


def step(default: Any = MISSING) -> Any:
    """A committed step: ``-1`` (none yet) or more."""
    return at_least(-1, STEP, default)


# Every report of every process is decoded by the controller (two heartbeats a second each):
# what a class's fields and hints are is looked up once, not for each message.
@functools.cache
def _shape(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """``hint``'s origin and arguments (``int | None``: ``UnionType``, ``(int, NoneType)``)."""
    return typing.get_origin(hint), typing.get_args(hint)


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    hint: Any
    required: bool
    omit: bool
    floor: float | None
    what: str | None


@functools.cache
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _Field(
            f.name,
            hints[f.name],
            f.default is MISSING and f.default_factory is MISSING,
            bool(f.metadata.get("omit")),
            f.metadata.get("floor"),
            f.metadata.get("what"),
        )
        for f in dataclasses.fields(cls)
    )


@functools.cache
def _floored(cls: type) -> tuple[_Field, ...]:
    return tuple(f for f in _fields(cls) if f.floor is not None)


def _conforms(value: Any, hint: Any) -> bool:
    origin, args = _shape(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return any(value == member.value and type(value) is type(member.value) for member in hint)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(k, str) and _conforms(v, args[1]) for k, v in value.items()
        )
    raise TypeError(f"unsupported field type {hint!r}")


def _convert(value: Any, hint: Any) -> Any:
    """JSON lists become the tuples the frozen classes hold; integers for floats, floats;
    an enumeration's value, its member."""
    args = _shape(hint)[1]
    if isinstance(value, list):
        tuples = [h for h in (hint, *args) if _shape(h)[0] is tuple]
        if not tuples:
            return tuple(value)
        return tuple(_convert(v, _shape(tuples[0])[1][0]) for v in value)
    for kind in (hint, *args):
        if isinstance(kind, type) and issubclass(kind, enum.Enum) and _conforms(value, kind):
            return kind(value)
    wants_float = hint is float or float in args
    if wants_float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


class Plain:
    """Base of the typed messages and events (see the module docstring)."""

    ERROR: ClassVar[type[Exception]] = ValueError
    KEY: ClassVar[str | None] = None  # the key naming the class on the wire ("kind", "type")
    TAG: ClassVar[str] = ""  # its value for this class

    def __post_init__(self) -> None:
        for f in _floored(type(self)):
            value = getattr(self, f.name)
            if value is not None and value < f.floor:  # type: ignore[operator]
                self._refuse(f"{f.name} {value!r} is not {f.what}")

    @classmethod
    def _refuse(cls, why: str) -> typing.NoReturn:
        raise cls.ERROR(f"{cls.TAG or cls.__name__}: {why}")

    def to_plain(self) -> dict[str, Any]:
        plain: dict[str, Any] = {self.KEY: self.TAG} if self.KEY else {}
        for f in _fields(type(self)):
            value = getattr(self, f.name)
            if value is None and f.omit:
                continue
            plain[f.name] = (
                [_plain(v) for v in value] if isinstance(value, tuple) else _plain(value)
            )
        return plain

    @classmethod
    def from_plain(cls, plain: Any) -> Any:
        if not isinstance(plain, dict):
            cls._refuse(f"expected a JSON object, got {type(plain).__name__}")
        if cls.KEY and plain.get(cls.KEY) != cls.TAG:
            cls._refuse(f"{cls.KEY} is {plain.get(cls.KEY)!r}, not {cls.TAG!r}")
        values: dict[str, Any] = {}
        for f in _fields(cls):
            if f.name not in plain:
                if f.required:
                    cls._refuse(f"missing field {f.name!r}")
                continue
            value = plain[f.name]
            if not _conforms(value, f.hint):
                cls._refuse(f"{f.name} {_short(value)} is not {f.what or _describe(f.hint)}")
            values[f.name] = _convert(value, f.hint)
        return cls(**values)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _describe(hint: Any) -> str:
    """What a value of ``hint`` is, in words: ``a float or null``, ``a list of str``..."""
    origin, args = _shape(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin is tuple:
        return f"a list of {_describe(args[0]).removeprefix('a ')}"
    if origin is dict:
        return f"an object of {_describe(args[1]).removeprefix('a ')}"
    if hint is Any:
        return "a JSON value"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(repr(member.value) for member in hint)
    return f"a {getattr(hint, '__name__', hint)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def registry(*classes: type[Plain]) -> dict[str, type[Plain]]:
    """``{TAG: class}`` for a dispatch by tag."""
    return {cls.TAG: cls for cls in classes}
