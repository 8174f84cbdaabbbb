"""A small DDP training script used by the multi-process tests (dropout, AdamW, scheduler)."""

import argparse
import contextlib
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

import torchrelay

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--out", default=None)
parser.add_argument("--bug-rank", type=int, default=-1, help="raise on this rank at --bug-step")
parser.add_argument("--bug-step", type=int, default=-1)
parser.add_argument("--compute-seconds", type=float, default=0.0, help="simulated extra compute")
parser.add_argument("--eval-rank", type=int, default=-1, help="a long evaluation on this rank")
parser.add_argument("--eval-step", type=int, default=-1)
parser.add_argument("--eval-seconds", type=float, default=0.0)
parser.add_argument("--eval-declared", type=int, default=1, help="inside relay.busy(...)")
parser.add_argument(
    "--hold-step", type=int, default=-1, help="every rank waits in this step for --hold-file"
)
parser.add_argument("--hold-file", default=None, help="created by the test to let the job end")
args = parser.parse_args()

relay = torchrelay.init(seed=7)
net = torch.nn.Sequential(
    torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 4)
).to(relay.device)
model = DDP(net, process_group=relay.process_group)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
relay.track(model=model, optimizer=opt, scheduler=sched)
data = TensorDataset(torch.randn(1024, 16), torch.randn(1024, 4))

for step, (x, y) in relay.steps(data, batch_size=8, max_steps=args.steps):
    if relay.rank == args.bug_rank and step == args.bug_step:
        raise ValueError(f"deliberate bug at step {step}")
    time.sleep(args.compute_seconds)  # stands in for a bigger model's compute time
    if relay.rank == args.eval_rank and step == args.eval_step:
        # stands in for a long evaluation on one rank, declared or (a stall, every time) not
        with relay.busy("evaluation") if args.eval_declared else contextlib.nullcontext():
            time.sleep(args.eval_seconds)
    if step == args.hold_step:
        # Tests pace the job by events: it cannot end before the test has done its drills.
        # An aborted generation (a drill's recovery) lets the rank out to recover; the step
        # is then dropped and comes back here after the recovery.
        with relay.busy("held by the test"):
            while not os.path.exists(args.hold_file) and not relay.guard.aborted:
                time.sleep(0.02)
    loss = F.mse_loss(model(x.to(relay.device)), y.to(relay.device))
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()

if relay.rank == 0 and args.out:
    torch.save({k: v.cpu().clone() for k, v in net.state_dict().items()}, args.out)
    print(f"final loss {loss.item():.6f}", flush=True)
