"""An ordinary torchrun DDP script, written as in PyTorch's multi-GPU tutorial and never for
torchrelay: its own Trainer class, a DistributedSampler, epochs, dropout, an LR scheduler,
gradient accumulation, its own snapshot file, and destroy_process_group() at the end. Run it with
``torchrun --nproc-per-node 2 plain_trainer.py --out w.pt`` or, unchanged, with
``torchrelay run --transparent --nproc-per-node 2 --spares 0 plain_trainer.py --out w.pt``.

With ``--augment``, each rank seeds torch, numpy and ``random`` with its own seed (as scripts
do for diverse dropout masks and augmentations) and every batch is augmented with draws from
all three. ``--hold EPOCH:PATH`` (repeatable; for tests) makes every rank wait at the start of
that epoch until the file exists, so that a test's operator command lands before the job ends
whatever the machine's load: the waiting changes nothing the training computes.
"""

import argparse
import contextlib
import os
import random
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Trainer:
    def __init__(self, model, loader, optimizer, scheduler, snapshot_path, accumulate, augment):
        self.rank = int(os.environ["LOCAL_RANK"])
        self.augment = augment
        self.model = DDP(model)
        self.loader = loader
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.snapshot_path = snapshot_path
        self.accumulate = accumulate
        self.epochs_run = 0
        self.holds = {}
        if snapshot_path and os.path.exists(snapshot_path):
            snapshot = torch.load(snapshot_path)
            self.model.module.load_state_dict(snapshot["model"])
            self.epochs_run = snapshot["epochs_run"]

    def _augmented(self, source):
        noise = torch.from_numpy(np.random.normal(0.0, 0.05, source.shape).astype(np.float32))
        return source * random.uniform(0.9, 1.1) + 0.05 * torch.randn_like(source) + noise

    def _run_batch(self, source, targets, last_micro_batch):
        if self.augment:
            source = self._augmented(source)
        # Gradient accumulation: only the last micro-batch of a step all-reduces.
        with contextlib.nullcontext() if last_micro_batch else self.model.no_sync():
            loss = F.mse_loss(self.model(source), targets) / self.accumulate
            loss.backward()
        if last_micro_batch:
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.scheduler.step()

    def _run_epoch(self, epoch):
        while epoch in self.holds and not os.path.exists(self.holds[epoch]):
            time.sleep(0.01)
        self.loader.sampler.set_epoch(epoch)
        for i, (source, targets) in enumerate(self.loader):
            self._run_batch(source, targets, (i + 1) % self.accumulate == 0)

    def _save_snapshot(self, epoch):
        snapshot = {"model": self.model.module.state_dict(), "epochs_run": epoch + 1}
        torch.save(snapshot, self.snapshot_path)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and self.snapshot_path:
                self._save_snapshot(epoch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--snapshot", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--augment", action="store_true", help="seed each rank apart, augment")
    parser.add_argument("--hold", action="append", default=[], help="EPOCH:PATH (see above)")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    torch.manual_seed(1234)
    data = TensorDataset(torch.randn(96, 16), torch.randn(96, 4))
    loader = DataLoader(
        data, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(data)
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    if args.augment:
        rank = dist.get_rank()
        torch.manual_seed(1000 + rank)
        np.random.seed(2000 + rank)
        random.seed(3000 + rank)
    trainer = Trainer(
        model, loader, optimizer, scheduler, args.snapshot, args.accumulate, args.augment
    )
    trainer.holds = {int(e): path for e, _, path in (h.partition(":") for h in args.hold)}
    trainer.train(args.epochs)
    if dist.get_rank() == 0 and args.out:
        torch.save(trainer.model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
