"""torchft 0.2.0 worker: one replica group of one process, Manager + DDP + optimizer wrappers.

Three notes on how this differs from torchft's own example, all needed for a working run:

- ``_FailureTolerantDDP``: torchft's DDP comm hook does ``assert fut._fut``, which fails after
  a gloo all-reduce error and kills the *healthy* replica (PEERS.md, 3 of 5 kills). The subclass
  returns the (already zeroed-out-by-manager) bucket instead; ``should_commit`` then drops the
  step exactly as torchft intends.
- No ``from __future__ import annotations`` here: DDP checks the hook's annotation is the
  real ``dist.GradBucket`` class.
- A start barrier (files in ``--marker-dir``): with ``min_replicas=1`` the first replica to ask
  would form a quorum alone and train alone until the other joins, so both groups wait until
  both managers exist. Restarted groups (``BENCH_ATTEMPT > 0``) skip it.
"""

import argparse
import datetime
import os
import time
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (puts the repository root on sys.path)
import torch
import torch.distributed as dist
from torchft import Manager, ProcessGroupGloo
from torchft.ddp import DistributedDataParallel
from torchft.optim import OptimizerWrapper

from bench.workload import (
    KillSwitch,
    ProgressLog,
    build_model,
    build_optimizer,
    loss_fn,
    make_batch,
    save_weights,
    worker_args,
)

BARRIER_TIMEOUT_S = 60.0


class _FailureTolerantDDP(DistributedDataParallel):
    """torchft's DDP whose comm hook survives a failed all-reduce (see module docstring)."""

    @staticmethod
    def _comm_hook(state: Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        work = state.allreduce(bucket.buffer())
        work.wait()
        inner = work.get_future()._fut  # type: ignore[attr-defined]
        if inner is not None:
            return inner
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done


def _start_barrier(marker_dir: str, group: int, groups: int) -> None:
    """Waits (bounded) until every replica group has created its manager."""
    directory = Path(marker_dir)
    (directory / f"ready{group}").touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while not all((directory / f"ready{g}").exists() for g in range(groups)):
        if time.monotonic() > deadline:
            raise TimeoutError("torchft start barrier: a replica group never started")
        time.sleep(0.01)  # watching other processes' files: no event to await


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    args = worker_args(parser)
    net = build_model(args.model)
    opt_inner = build_optimizer(net)

    def state_dict() -> dict[str, Any]:
        return {"model": net.state_dict(), "optim": opt_inner.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        net.load_state_dict(sd["model"])
        opt_inner.load_state_dict(sd["optim"])

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=datetime.timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"bench_{args.group}",
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args.lighthouse,
        timeout=datetime.timedelta(seconds=10),
        init_sync=False,
    )
    model = _FailureTolerantDDP(manager, net)
    opt = OptimizerWrapper(manager, opt_inner)
    if os.environ.get("BENCH_ATTEMPT", "0") == "0":
        _start_barrier(args.marker_dir, args.group, args.groups)
    log = ProgressLog(args.progress_file if args.group == 0 else None)
    kill = KillSwitch(args.group, args.kill_rank, args.kill_steps, args.marker_dir)
    while (step := manager.current_step()) < args.steps:
        kill.maybe_kill(step)
        opt.zero_grad()  # starts the (async) quorum; a recovering group heals during forward
        loss_fn(model, make_batch(args.model, step, args.group)).backward()
        opt.step()  # commits only if every participant's all-reduce succeeded
        if manager.current_step() > step:
            log.commit(step, manager.num_participants())
    if args.group == 0:
        save_weights(net, args.out)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
