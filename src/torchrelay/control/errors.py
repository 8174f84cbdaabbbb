"""The errors the controller answers a request with (the control server maps them to gRPC codes)."""

from __future__ import annotations


class FencedError(RuntimeError):
    """A process of an older generation tried to take part in a newer one."""


class ProtocolError(ValueError):
    """A well-authenticated message that makes no sense for the job's current state."""


class IllegalTransition(ProtocolError):
    """A member was asked to move between two states that no path of the protocol links."""
