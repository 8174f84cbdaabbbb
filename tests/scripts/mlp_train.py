"""A small DDP training script used by the multi-process tests (dropout, AdamW, scheduler)."""

import argparse
import contextlib
import os
import signal
import threading
import time
from pathlib import Path

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
parser.add_argument("--before-init", choices=["raise", "exit"], help="fail before init()")
parser.add_argument("--die-in-setup", type=int, default=-1, help="SIGKILL this rank after init()")
parser.add_argument("--track-inner", action="store_true", help="track(model=ddp.module)")
parser.add_argument("--fail-saving", action="store_true", help="rank 0 raises after the loop")
parser.add_argument("--print-steps", action="store_true", help="a line per committed step")
parser.add_argument(
    "--leash", type=Path, default=None, help="a file with the first step that must wait (tests)"
)
parser.add_argument(
    "--spare-leash", type=Path, default=None, help="spares wait for this file before their loop"
)
parser.add_argument(
    "--hears-late", type=int, default=-1, help="this rank hears a handover's boundary late"
)
args = parser.parse_args()

if args.before_init == "raise":
    raise RuntimeError("deliberate bug before torchrelay.init()")
if args.before_init == "exit":
    raise SystemExit(0)


def held(step: int) -> bool:
    """The test's leash: step ``step`` waits until the number in ``--leash`` exceeds it."""
    try:
        return step >= int(args.leash.read_text())
    except (OSError, ValueError):  # not written yet
        return True


def hear_boundaries_late(boundary) -> None:
    """This rank hears a handover's boundary only once it committed that step and looked past
    it (as if the message reached it late; ranks run in lockstep, so no load can single one
    out): the watch thread waits for the training thread's look."""
    looked, last = threading.Condition(), [(-1, -1)]
    due, tell = boundary.due, boundary.tell

    def looking(generation: int, committed: int) -> bool:
        answer = due(generation, committed)
        with looked:
            last[0] = (generation, committed)
            looked.notify_all()
        return answer

    def hearing(generation: int, step: int, say_late) -> None:
        with looked:
            looked.wait_for(lambda: last[0] >= (generation, step))
        tell(generation, step, say_late)

    boundary.due, boundary.tell = looking, hearing


relay = torchrelay.init(seed=7)
if relay.rank == args.hears_late:
    hear_boundaries_late(relay._handover)
if relay.rank == args.die_in_setup:  # lost between init() and DDP's set-up broadcast
    os.kill(os.getpid(), signal.SIGKILL)
net = torch.nn.Sequential(
    torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 4)
).to(relay.device)
model = DDP(net, process_group=relay.process_group)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
relay.track(model=model.module if args.track_inner else model, optimizer=opt, scheduler=sched)
data = TensorDataset(torch.randn(1024, 16), torch.randn(1024, 4))

while args.spare_leash and relay.is_spare and not args.spare_leash.exists():
    time.sleep(0.02)  # a spare held before it reports ready: a recovery waits for it (tests)
for step, (x, y) in relay.steps(data, batch_size=8, max_steps=args.steps):
    if relay.rank == args.bug_rank and step == args.bug_step:
        raise ValueError(f"deliberate bug at step {step}")
    time.sleep(args.compute_seconds)  # stands in for a bigger model's compute time
    if relay.rank == args.eval_rank and step == args.eval_step:
        # stands in for a long evaluation on one rank, declared or (a stall, every time) not
        with relay.busy("evaluation") if args.eval_declared else contextlib.nullcontext():
            time.sleep(args.eval_seconds)
    if args.leash and held(step):
        # Tests pace the job by their own events, never by its speed: a drill lands while the
        # job waits here, and the job goes on when the test moves the leash. A drill's recovery
        # (an aborted generation) lets the rank out: the step is dropped and redone after it.
        with relay.busy("held by the test"):
            while held(step) and not relay.guard.aborted:
                time.sleep(0.02)
    loss = F.mse_loss(model(x.to(relay.device)), y.to(relay.device))
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    if args.print_steps:
        print(f"step {step} loss {loss.item():.6f}", flush=True)

if relay.rank == 0 and args.fail_saving:
    raise OSError("deliberate failure while saving the final model")
if relay.rank == 0 and args.out:
    torch.save({k: v.cpu().clone() for k, v in net.state_dict().items()}, args.out)
    # A spare that took its slot after the last commit ran no step here: it has no loss.
    if "loss" in globals():
        print(f"final loss {loss.item():.6f}", flush=True)
