"""torchrelay worker: the shared workload inside ``relay.steps`` (hot spare, no rollback)."""

from __future__ import annotations

import os

import _path  # noqa: F401  (puts the repository root on sys.path)
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

import torchrelay
from bench.workload import (
    RESIDENT_GIB,
    SEED,
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


def _log_commits(log: ProgressLog, committed: int, logged: int, world: int) -> int:
    """Logs the steps committed since ``logged``; returns the new high-water mark."""
    for step in range(logged + 1, committed + 1):
        log.commit(step, world)
    return max(logged, committed)


def main() -> None:
    args = worker_args()
    relay = torchrelay.init(seed=SEED)
    # Host memory a real trainer holds besides its state (pinned staging, data loader caches,
    # CUDA's host allocations): written, so resident, and the kernel unmaps it when killed.
    _resident = torch.ones(int(float(os.environ.get(RESIDENT_GIB, "0")) * 2**28))
    net = build_model(args.model)
    model = DDP(net, process_group=relay.process_group)
    opt = build_optimizer(model)
    relay.track(model=model, optimizer=opt)
    # relay.steps needs a dataset to drive its step sampler; the batch itself comes from
    # make_batch(step, rank) so that all four systems train on identical samples.
    steps = TensorDataset(torch.zeros(64, 1))
    log = kill = facts = None
    logged = -1
    for step, _ in relay.steps(steps, batch_size=1, max_steps=args.steps):
        if kill is None:  # a spare learns its slot only when it is handed one
            kill = KillSwitch(relay.rank, args.kill_rank, args.kill_steps, args.marker_dir)
            log = ProgressLog(args.progress_file if relay.rank == 0 else None)
            facts = RuntimeFacts(relay.rank, warmup=args.steps // 5)
            logged = step - 1
        # A step counts only once relay.steps has committed it (a step whose all-reduce failed
        # is dropped and yielded again), so the log trails by one iteration, at the boundary.
        logged = _log_commits(log, relay.committed, logged, relay.world_size)
        facts.at(step)
        kill.maybe_kill(step)
        loss_fn(model, make_batch(args.model, step, relay.rank)).backward()
        opt.step()
        opt.zero_grad()
    if log is not None:
        _log_commits(log, relay.committed, logged, relay.world_size)
        facts.write(relay.committed)
    if relay.rank == 0:
        save_weights(net, args.out)


if __name__ == "__main__":
    main()
