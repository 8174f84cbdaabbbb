"""The base of every control message (:mod:`torchrelay.control.protocol`, which also re-exports
:mod:`torchrelay.control.node_protocol`): :class:`Wire`, the generation fields, and the decoder
that picks a family's class by the message's key. Imports neither torch nor the controller."""

from __future__ import annotations

from typing import Any, ClassVar

from torchrelay.control.errors import ProtocolError
from torchrelay.typed import Plain, at_least

GENERATION = "a generation (an integer >= 0)"
# A spare is in no generation until a plan gives it a slot.
MEMBER_GENERATION = "a generation (an integer >= 0, or -1 for a spare without a slot)"


class Wire(Plain):
    """A control message: ``to_wire`` / ``from_wire`` over :class:`Plain`."""

    ERROR: ClassVar[type[Exception]] = ProtocolError

    def to_wire(self) -> dict[str, Any]:
        return self.to_plain()

    @classmethod
    def from_wire(cls, wire: Any) -> Any:
        return cls.from_plain(wire)


def member_generation() -> Any:
    """The optional ``generation`` a member reports from (-1: a spare without a slot)."""
    return at_least(-1, MEMBER_GENERATION, default=None, omit=True)


def decode_family(family: dict[str, type[Plain]], key: str, what: str, wire: Any) -> Any:
    """The message ``wire`` of ``family``, by its ``key``; :class:`ProtocolError` (one line)."""
    if not isinstance(wire, dict):
        raise ProtocolError(f"a {what} must be a JSON object, not {type(wire).__name__}")
    tag = wire.get(key)
    cls = family.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"unknown {what} {key} {tag!r}")
    return cls.from_plain(wire)
