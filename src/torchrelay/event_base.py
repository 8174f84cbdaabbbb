"""The base of every ledger event (see :mod:`torchrelay.events`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from torchrelay.ledger import LedgerError
from torchrelay.typed import Plain


@dataclass(frozen=True, kw_only=True)
class Event(Plain):
    """A ledger event; ``t`` None: stamped with the time it is written (every line has one)."""

    ERROR: ClassVar[type[Exception]] = LedgerError
    KEY: ClassVar[str] = "event"
    t: float | None = None

    @classmethod
    def from_json(cls, entry: Any) -> Any:
        if isinstance(entry, dict) and not isinstance(entry.get("t"), (int, float)):
            cls._refuse(f"t {entry.get('t')!r} is not a time (the seconds of the epoch)")
        return cls.from_plain(entry)

    def to_json(self) -> dict[str, Any]:
        """The ledger line's object: ``t`` first (now, unless the event has its own), then
        ``event`` and the fields."""
        plain = self.to_plain()
        del plain["t"]
        return {"t": time.time() if self.t is None else self.t, **plain}
