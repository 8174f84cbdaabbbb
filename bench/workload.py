"""The one workload every system trains: same model, same optimizer, same batches.

Everything a worker does that is not specific to its fault-tolerance system lives here, so the
four worker scripts differ only in how they launch, communicate and recover:

- ``build_model`` is deterministic given the seed, so every rank of every system starts equal.
- ``make_batch(step, rank)`` is a pure function of ``(step, rank)``: a replacement, a restarted
  worker and a hot spare all read exactly the samples the dead rank would have read.
- ``ProgressLog`` appends ``step time participants`` for every committed step (rank 0 only), the
  single source the stall/lost/recomputed metrics are computed from for all systems.
- ``KillSwitch`` SIGKILLs the calling worker at the first step >= each scheduled step, once per
  schedule entry (a marker file, created atomically, records the kill time and keeps a restarted
  or replacement process from killing itself again).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

SEED = 1234
# GiB of host memory each torchrelay worker writes besides its state (bench.stall --resident-gib)
RESIDENT_GIB = "BENCH_RESIDENT_GIB"
LR = 1e-3


@dataclass(frozen=True)
class ModelSize:
    """An MLP shape; ``params`` is exact."""

    d_in: int
    hidden: int
    d_out: int
    batch: int

    @property
    def params(self) -> int:
        return (
            (self.d_in + 1) * self.hidden
            + (self.hidden + 1) * self.hidden
            + (self.hidden + 1) * self.d_out
        )

    @property
    def state_bytes(self) -> int:
        """Weights and AdamW's two moments, float32."""
        return self.params * 4 * 3


# small ~ the README's 1.26 M-parameter demo GPT; large ~ 100 MB of weights + AdamW state.
MODELS: dict[str, ModelSize] = {
    "small": ModelSize(d_in=128, hidden=1040, d_out=64, batch=32),
    "large": ModelSize(d_in=192, hidden=2752, d_out=64, batch=32),
}
STATE_PREFIX = "state:"  # a model named by its state's size: ``state:250`` holds ~250 MB


def model_size(name: str) -> ModelSize:
    """The shape a model name stands for: a :data:`MODELS` key, or ``state:MB``, the small
    model's shape with the hidden width that makes weights and AdamW state about ``MB`` MB
    (``bench.state_sweep``). ``ValueError`` for anything else."""
    if name in MODELS:
        return MODELS[name]
    mb = name.removeprefix(STATE_PREFIX)
    if mb == name or not mb.isdigit() or int(mb) < 1:
        raise ValueError(f"{name!r}: not one of {sorted(MODELS)} nor {STATE_PREFIX}MB")
    base = MODELS["small"]
    # params = hidden^2 + (d_in + d_out + 2) hidden + d_out; 12 bytes each with AdamW's moments
    linear = base.d_in + base.d_out + 2
    params = int(mb) * 1e6 / 12
    hidden = round((-linear + (linear**2 + 4 * (params - base.d_out)) ** 0.5) / 2)
    return ModelSize(base.d_in, max(hidden, 1), base.d_out, base.batch)


def build_model(size: str) -> nn.Module:
    """The MLP of ``model_size(size)``, initialised from ``SEED`` (identical on every process)."""
    shape = model_size(size)
    torch.manual_seed(SEED)
    return nn.Sequential(
        nn.Linear(shape.d_in, shape.hidden),
        nn.GELU(),
        nn.Linear(shape.hidden, shape.hidden),
        nn.GELU(),
        nn.Linear(shape.hidden, shape.d_out),
    )


def build_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with fixed hyper-parameters (the same for every system)."""
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def make_batch(size: str, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``rank`` at ``step``: a pure function of its arguments (own generator)."""
    shape = model_size(size)
    gen = torch.Generator().manual_seed(SEED * 1_000_003 + step * 1009 + rank)
    x = torch.randn(shape.batch, shape.d_in, generator=gen)
    y = torch.randn(shape.batch, shape.d_out, generator=gen)
    return x, y


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean squared error of the model on the batch."""
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


class ProgressLog:
    """Appends one ``step unix_time participants`` line per committed step, flushed at once.

    Appending (not truncating) matters: a torchrun restart reopens the same file, and the
    rolled-back steps show up as repeated step numbers, which is how rollback is measured.
    """

    def __init__(self, path: str | None) -> None:
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def commit(self, step: int, participants: int) -> None:
        if self._file is not None:
            self._file.write(f"{step} {time.time():.6f} {participants}\n")


class RuntimeFacts:
    """What decides a worker's speed besides the model: its thread pools, CPU affinity, OS
    threads, and the CPU seconds it spends per step (user + system, all its threads) from step
    ``warmup`` on -- a cost that other people's load on the machine does not change, unlike
    steps/s. Written as JSON to ``$BENCH_FACTS`` (if set) by rank 0 at the end of its loop."""

    def __init__(self, rank: int | None, warmup: int) -> None:
        self._path = os.environ.get("BENCH_FACTS") if rank == 0 else None
        self._warmup = warmup
        self._start: tuple[int, float] | None = None

    def at(self, step: int) -> None:
        if self._path and self._start is None and step >= self._warmup:
            self._start = (step, time.process_time())

    def write(self, last_step: int) -> None:
        if not (self._path and self._start):
            return
        first, cpu = self._start
        status = Path("/proc/self/status").read_text()
        facts = {
            "intra_op_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "os_threads": int(status.split("Threads:")[1].split()[0]),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpu_s_per_step": (time.process_time() - cpu) / max(1, last_step - first),
        }
        Path(self._path).write_text(json.dumps(facts))


class KillSwitch:
    """SIGKILLs this process at the first step >= each scheduled step, once per entry."""

    def __init__(self, rank: int | None, kill_rank: int, steps: list[int], marker_dir: str):
        self._armed = rank == kill_rank and bool(steps)
        self._steps = steps
        self._dir = Path(marker_dir)

    def maybe_kill(self, step: int) -> None:
        if not self._armed:
            return
        for index, at in enumerate(self._steps):
            if step < at:
                return
            marker = self._dir / f"kill{index}"
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue  # this entry already fired (in an earlier process)
            os.write(fd, f"{at} {step} {time.time():.6f}\n".encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)


def save_weights(model: nn.Module, path: str | None) -> None:
    """Saves the unwrapped module's state dict (cloned tensors) to ``path`` if given."""
    if path:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, path)


def parse_model_name(name: str) -> str:
    """``--model``'s argparse type: ``name`` if :func:`model_size` knows it."""
    try:
        model_size(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def worker_args(extra: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The command line every worker script accepts (systems add their own flags)."""
    parser = extra or argparse.ArgumentParser()
    parser.add_argument("--model", type=parse_model_name, default="small")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--progress-file", default=None)
    parser.add_argument("--out", default=None, help="rank 0 saves final weights here")
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--kill-steps", default="", help="comma-separated steps")
    parser.add_argument("--marker-dir", default=".")
    args = parser.parse_args()
    args.kill_steps = [int(s) for s in args.kill_steps.split(",") if s]
    return args
