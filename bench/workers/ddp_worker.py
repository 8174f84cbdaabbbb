"""Plain torch DDP worker under torchrun; with ``--ckpt-every K`` it is the status quo.

With checkpoints, rank 0 saves model + optimizer + step every K committed steps (atomically:
write then rename), and every (re)started worker resumes from the latest checkpoint, so a
torchrun restart rolls the job back to that step and recomputes the steps since.
"""

from __future__ import annotations

import argparse
import datetime
import os

import _path  # noqa: F401  (puts the repository root on sys.path)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.workload import (
    KillSwitch,
    ProgressLog,
    RuntimeFacts,
    build_model,
    build_optimizer,
    loss_fn,
    make_batch,
    save_weights,
    worker_args,
)


def init_group() -> tuple[int, int]:
    """Joins a gloo group under a store prefix unique to this torchrun attempt.

    Without the prefix a restarted attempt reads the previous attempt's peer addresses from
    the agent's store and fails with ``connectFullMesh ... Connection refused`` (PEERS.md).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=datetime.timedelta(seconds=60),
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"bench/attempt{attempt}", store),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    return rank, world


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--ckpt-path", default=None)
    args = worker_args(parser)
    rank, world = init_group()
    net = build_model(args.model)
    model = DDP(net)
    opt = build_optimizer(model)
    start = 0
    if args.ckpt_every and args.ckpt_path and os.path.exists(args.ckpt_path):
        ckpt = torch.load(args.ckpt_path)
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"] + 1
    log = ProgressLog(args.progress_file if rank == 0 else None)
    kill = KillSwitch(rank, args.kill_rank, args.kill_steps, args.marker_dir)
    facts = RuntimeFacts(rank, warmup=args.steps // 5)
    for step in range(start, args.steps):
        facts.at(step)
        kill.maybe_kill(step)
        loss_fn(model, make_batch(args.model, step, rank)).backward()
        opt.step()
        opt.zero_grad()
        log.commit(step, world)
        if rank == 0 and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            tmp = f"{args.ckpt_path}.tmp"
            torch.save(
                {"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp
            )
            os.replace(tmp, args.ckpt_path)
    facts.write(args.steps - 1)
    if rank == 0:
        save_weights(net, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
