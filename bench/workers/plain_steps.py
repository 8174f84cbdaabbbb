"""The steady-state bench's training script: an ordinary torchrun DDP script (the loop of
``tests/scripts/plain_trainer.py``: a DistributedSampler, dropout, SGD with momentum, an LR
scheduler), never written for torchrelay, with a model big enough that a step takes tens of
milliseconds on one thread. ``bench.transparent`` runs it unchanged under ``torchrun`` and
under ``torchrelay run --transparent``.

Rank 0 records, after every step, the wall clock and its process CPU time; with
``BENCH_STEP_LOG`` set it writes them there as JSON at the end (the same measure on both
sides: it is taken in the script, after ``optimizer.step()``, whatever the launcher).
With ``BENCH_HOOK_TIMES`` set as well and the transparent hook present, it also times the
hook's per-step work with ``perf_counter`` (see :func:`_time_hook`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WIDTH = 1024
FEATURES = 256


def _time_hook(spent: dict[str, list[float]]) -> None:
    """Wraps the hook's per-step entry points (only where the hook is installed): the commit
    (which takes the next step's boundary snapshot), the snapshot before the first fetch, the
    snapshot itself and its RNG mirror's write; each call's seconds go to ``spent``."""
    hook = sys.modules.get("torchrelay.transparent.hook")
    if hook is None:
        return

    def timed(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent.setdefault(name, []).append(time.perf_counter() - start)

        return wrapper

    worker = hook.TransparentWorker
    for name in ("_commit", "_before_fetch", "on_forward"):
        setattr(worker, name, timed(name, getattr(worker, name)))
    # The snapshot alone (taken inside _commit, and in _before_fetch); a bound classmethod.
    hook.Boundary.take = staticmethod(timed("Boundary.take", hook.Boundary.take))
    streams = hook.SlotStreams
    streams.record = timed("SlotStreams.record", streams.record)  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    spent: dict[str, list[float]] = {}
    if os.environ.get("BENCH_HOOK_TIMES"):
        _time_hook(spent)
    dist.init_process_group(backend="gloo")
    world = dist.get_world_size()
    torch.manual_seed(1234)
    samples = args.steps * args.batch_size * world
    data = TensorDataset(torch.randn(samples, FEATURES), torch.randn(samples, FEATURES))
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, FEATURES),
    )
    ddp = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    marks: list[tuple[float, float]] = []
    for source, targets in loader:
        F.mse_loss(ddp(source), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        marks.append((time.perf_counter(), time.process_time()))
    log = os.environ.get("BENCH_STEP_LOG")
    if log and dist.get_rank() == 0:
        with open(log, "w") as out:
            json.dump({"marks": marks, "hook": spent}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
