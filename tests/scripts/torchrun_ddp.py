"""A plain torchrun DDP script, unmodified for torchrelay: it calls
``dist.init_process_group("gloo")`` itself and never ``torchrelay.init()``."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--out", default=None)
parser.add_argument("--env-out", default=None, help="each rank writes its torchrun variables here")
args = parser.parse_args()

# What torchrun sets for a worker (tests/test_torchrun_flags.py compares torchrelay's).
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)
if args.env_out:
    seen = {name: os.environ.get(name) for name in TORCHRUN_VARIABLES}
    with open(os.path.join(args.env_out, f"rank{os.environ['RANK']}.json"), "w") as out:
        json.dump(seen, out)

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
print(f"rank {dist.get_rank()} trained {args.steps} steps", flush=True)
if dist.get_rank() == 0 and args.out:
    torch.save(model.module.state_dict(), args.out)
dist.destroy_process_group()
