"""An ordinary DDP script as one ports it (multi-process tests of the public API).

Plain torch.distributed on the default group (DistributedSampler, get_rank, all_reduce,
destroy_process_group), a rank-local loss sum in ``relay.track(local=...)``, epochs from
``relay.epoch``, and its own snapshot: resumed from with ``start_step``, never on a spare.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import torchrelay

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--out", default=None)
parser.add_argument("--snapshot", default=None, help="resume from / save to this file")
parser.add_argument("--replicated-counter", action="store_true", help="a misuse, to be reported")
parser.add_argument(
    "--loader-workers", type=int, default=0, help="load with this many workers, augmenting"
)
args = parser.parse_args()


class Jitter(torch.utils.data.Dataset):
    """A random augmentation, drawn where the loader fetches (in its workers, if any)."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        x, y = self.base[index]
        return x + 0.1 * torch.randn_like(x), y


def note_worker(worker_id):
    """One line per loader worker started, with the rank it fetches for."""
    if args.out:
        with open(f"{args.out}.loader_workers", "a") as f:
            f.write(f"{os.environ['RANK']}\n")


relay = torchrelay.init(seed=5)
dist.init_process_group("gloo")  # left in from the torchrun version: does nothing
data = TensorDataset(torch.randn(96, 16), torch.randn(96, 4))
if args.loader_workers:
    data = Jitter(data)
loader = DataLoader(
    data,
    batch_size=8,
    sampler=DistributedSampler(data, shuffle=True, seed=3),
    num_workers=args.loader_workers,
    worker_init_fn=note_worker,
)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4))
model = DDP(net, process_group=relay.process_group)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
stats = {"loss_sum": 0.0, "global_loss_sum": 0.0}
relay.track(model=model, optimizer=opt, scheduler=sched, local=stats)
if args.replicated_counter:

    class Counter:
        value = 0.0

        def state_dict(self):
            return {"value": self.value}

        def load_state_dict(self, state):
            self.value = state["value"]

    per_rank = Counter()
    relay.track(per_rank_loss=per_rank)

start_step = 0
if args.snapshot and os.path.exists(args.snapshot) and not relay.is_spare:
    snapshot = torch.load(args.snapshot, weights_only=True)
    for name, obj in (("model", net), ("optimizer", opt), ("scheduler", sched)):
        obj.load_state_dict(snapshot[name])
    start_step = snapshot["steps_run"]
    print(f"Resuming training from snapshot at step {start_step}", flush=True)

epochs = []
for step, (x, y) in relay.steps(loader, max_steps=args.steps, start_step=start_step):
    assert dist.get_rank() == relay.rank and dist.get_world_size() == relay.world_size
    epochs.append([step, relay.epoch, relay.steps_per_epoch])
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total)
    stats["loss_sum"] += loss.item()
    stats["global_loss_sum"] += total.item()
    if args.replicated_counter:
        per_rank.value += loss.item()

if args.out:
    with open(f"{args.out}.rank{dist.get_rank()}.json", "w") as f:
        json.dump({"stats": stats, "epochs": epochs}, f)
    if dist.get_rank() == 0:
        torch.save({k: v.clone() for k, v in net.state_dict().items()}, args.out)
if args.snapshot and dist.get_rank() == 0:
    state = {"model": net.state_dict(), "optimizer": opt.state_dict()}
    torch.save({**state, "scheduler": sched.state_dict(), "steps_run": args.steps}, args.snapshot)
dist.destroy_process_group()
