"""A plain torch training process for the snapshot tests and bench: an MLP with Adam.

``python park_mlp.py STEPS PARK_AT [HIDDEN]`` prints ``step <i> <loss>`` (the loss's exact
repr) per step, parks once before step PARK_AT (what transparent mode's hook does at a step
boundary; -1: never) and prints ``instruction <kind> <slot>`` once released. Its state --
weights, Adam's moments, the data generator -- lives only in this process, so a copy that
prints the reference losses carried all of it.
"""

import os
import sys

import torch

from torchrelay.transparent import park

steps, park_at = int(sys.argv[1]), int(sys.argv[2])
hidden = int(sys.argv[3]) if len(sys.argv) > 3 else 64
torch.manual_seed(0)
data = torch.Generator().manual_seed(1)
model = torch.nn.Sequential(
    torch.nn.Linear(16, hidden),
    torch.nn.Tanh(),
    torch.nn.Linear(hidden, hidden),
    torch.nn.Tanh(),
    torch.nn.Linear(hidden, 1),
)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 4  # + grad, moments
print(f"state_bytes {state_bytes}", flush=True)
for step in range(steps):
    if step == park_at:
        instruction = park.wait(os.environ["TORCHRELAY_TOKEN"])
        print(f"instruction {instruction.kind.value} {instruction.slot}", flush=True)
    x = torch.randn(32, 16, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} {loss.item()!r}", flush=True)
