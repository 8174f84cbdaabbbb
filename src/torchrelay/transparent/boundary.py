"""The step boundary's snapshot, and voiding a step back to it.

A SIGKILL lands mid-step: the survivors are inside a gradient all-reduce whose missing
contribution nobody has, in Python frames that cannot be rewound. The stable process group
(:mod:`torchrelay.runtime.facade`) already lets their collectives return (values unused) and
poisons the step. What the script's loop body did meanwhile is then undone here, so that its
next iteration *is* the voided step again. The snapshot is taken where that iteration starts:
at the optimizer step that ends the previous step, and again, in a loop over a
``DistributedSampler``'s loader, before the step's first batch is fetched (what ran between,
such as a new epoch's DataLoader iterator drawing its seed, is not run again). Undone:

- the global RNG streams (torch CPU and CUDA, numpy, ``random``) go back to the boundary's
  (the voided step's random data and dropout masks are drawn again, identically);
- every ``DistributedSampler`` cursor goes back to its boundary position (:mod:`sampler`);
- the buffers of every DDP module (BatchNorm running statistics) go back to the boundary's;
- the optimizers' gradients are dropped (``set_to_none``); the optimizer step itself, the LR
  scheduler's and a ``GradScaler``'s update of the voided step never ran (see :mod:`hook`).

Parameters and optimizer state need no snapshot: they change only in ``optimizer.step()``,
which a poisoned step skips. A snapshot costs a copy of the RNG states and of the DDP buffers
per step (no parameter is copied).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchrelay.transparent import sampler


@dataclass
class Boundary:
    """Everything a voided step changed outside its optimizer, as it was at the boundary."""

    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    numpy_rng: Any
    python_rng: Any
    cursors: sampler.Positions
    buffers: list[tuple[torch.nn.Module, list[torch.Tensor]]]

    @classmethod
    def take(cls, modules: Iterable[torch.nn.Module]) -> Boundary:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(
            torch_rng=torch.get_rng_state(),
            cuda_rng=cuda,
            numpy_rng=np.random.get_state(),
            python_rng=random.getstate(),
            cursors=sampler.positions(),
            buffers=[(m, [b.detach().clone() for b in m.buffers()]) for m in modules],
        )

    def restore(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Void the step: put back what :meth:`take` saw, and drop ``optimizers``' gradients."""
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        np.random.set_state(self.numpy_rng)
        random.setstate(self.python_rng)
        sampler.rewind(self.cursors)
        with torch.no_grad():
            for module, saved in self.buffers:
                for buffer, value in zip(module.buffers(), saved, strict=True):
                    buffer.copy_(value)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
