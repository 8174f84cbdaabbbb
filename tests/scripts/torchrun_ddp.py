"""A plain torchrun DDP script, unmodified for torchrelay: it calls
``dist.init_process_group("gloo")`` itself and never ``torchrelay.init()``."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--out", default=None)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
if dist.get_rank() == 0 and args.out:
    torch.save(model.module.state_dict(), args.out)
dist.destroy_process_group()
