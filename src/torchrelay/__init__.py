"""torchrelay: distributed PyTorch training that survives failures without rollback.

Model-aware API::

    relay = torchrelay.init()
    model = DDP(Net(), process_group=relay.process_group)
    relay.track(model=model, optimizer=opt, scheduler=sched)
    for step, batch in relay.steps(dataset, batch_size=32, max_steps=2000):
        ...
"""

from torchrelay.runtime.relay import Relay, init

__all__ = ["Relay", "init"]
__version__ = "0.1.0"
