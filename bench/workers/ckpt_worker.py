"""Checkpoint benchmark worker: a DDP MLP of about ``--state-mb`` MB of tracked state (weights
plus AdamW's two moments), trained for ``--steps``; rank 0 writes the wall time of every
committed step (and its checkpoints' blocking times) to ``--out`` as JSON."""

from __future__ import annotations

import argparse
import json
import time

import _path  # noqa: F401  (puts the repository root on sys.path)
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import torchrelay

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--width", type=int, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

relay = torchrelay.init(seed=0)
net = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.Tanh())
model = DDP(net, process_group=relay.process_group)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
relay.track(model=model, optimizer=opt)
done: list[tuple[int, float]] = []
for step, _ in relay.steps(max_steps=args.steps):
    x = torch.randn(32, args.width)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    done.append((step, time.time()))
if relay.rank == 0:
    blocked = [] if relay.checkpoints is None else relay.checkpoints.blocked_seconds
    with open(args.out, "w") as file:
        json.dump({"steps": done, "blocked": blocked}, file)
