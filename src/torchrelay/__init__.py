"""torchrelay: distributed PyTorch training that survives failures without rollback.

Model-aware API::

    relay = torchrelay.init()
    model = DDP(Net(), process_group=relay.process_group)
    relay.track(model=model, optimizer=opt, scheduler=sched)
    for step, batch in relay.steps(dataset, batch_size=32, max_steps=2000):
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchrelay.runtime.relay import Relay, init

__all__ = ["Relay", "init"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the operator commands (``torchrelay status``, ``chaos``,
    # ``report``, ``simulate``), which import this package but never train, do not pay the
    # seconds that importing torch takes.
    if name in __all__:
        from torchrelay.runtime import relay

        return getattr(relay, name)
    raise AttributeError(f"module 'torchrelay' has no attribute {name!r}")
