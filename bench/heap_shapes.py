"""``python -m bench.heap_shapes``: a worker's memory and speed when its tensors change shape.

A torchrelay worker keeps its large freed blocks in its heap (:mod:`torchrelay.runtime.allocator`):
a step of a fixed-shape model then faults nothing, and its resident size stays at the most it
held at once. A workload whose batches change shape (variable sequence lengths, variable batch
sizes) asks for blocks of new sizes all the time, so a heap that never gives memory back could
fragment: hold more than the workload ever needed at once, and grow.

Each run is a fresh process, started with the environment a node agent gives a worker
(:func:`bench.procs.worker_env`), that calls :func:`~torchrelay.runtime.allocator.keep_freed_memory`
as a worker does and trains a small transformer (two encoder layers, AdamW) on random batches:
a batch size from the powers of two up to ``--max-batch`` and a sequence length up to
``--max-seq``, the same sequence of shapes in every run. Runs alternate between large blocks
kept (the default) and returned (``TORCHRELAY_KEEP_LARGE_BLOCKS=0``), and each reports its
peak resident size, its resident size over the run, its step time and its page faults.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.procs import resident_mib, worker_env
from torchrelay.heap import KEEP_LARGE_BLOCKS_SWITCH

SETTINGS = {"kept": "1", "returned": "0"}


@dataclass(frozen=True)
class Shapes:
    """The workload: ``steps`` batches of random shapes drawn from ``seed``."""

    steps: int
    max_batch: int
    max_seq: int
    width: int
    seed: int

    def draw(self) -> list[tuple[int, int]]:
        """``(batch, sequence)`` for each step: the same list for the same workload."""
        rng = random.Random(self.seed)
        batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= self.max_batch]
        return [(rng.choice(batches), rng.randint(16, self.max_seq)) for _ in range(self.steps)]


def train(shapes: Shapes) -> dict[str, Any]:
    """Train on ``shapes`` in this process; the figures :func:`summary` reads."""
    import torch  # here, in the child: the parent that starts the runs needs no torch

    from torchrelay.heap import keeps_large_blocks
    from torchrelay.runtime.allocator import keep_freed_memory

    keep_freed_memory(os.environ)
    torch.manual_seed(0)
    layer = {"nhead": 4, "dim_feedforward": 4 * shapes.width, "batch_first": True}
    model = torch.nn.Sequential(
        *(torch.nn.TransformerEncoderLayer(shapes.width, **layer) for _ in range(2))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_s, faults, resident = [], [], []
    every = max(1, shapes.steps // 10)
    for step, (batch, seq) in enumerate(shapes.draw(), 1):
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        model(torch.randn(batch, seq, shapes.width)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_s.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        resident.append(resident_mib(os.getpid()))
        if step % every == 0:  # progress, on the parent's terminal
            print(f"  step {step}/{shapes.steps}: {resident[-1]:,.0f} MB resident", file=sys.stderr)
    return {
        "keeps_large_blocks": keeps_large_blocks(os.environ),
        "step_s": step_s,
        "faults": faults,
        "resident_mib": resident,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def summary(setting: str, run: dict[str, Any]) -> dict[str, Any]:
    """One run's row: the step time, faults a step, and the resident size at its peak, over the
    run (median) and at the end; the first two steps, where every heap grows, left out."""
    later = slice(2, None)
    return {
        "setting": setting,
        "total_s": sum(run["step_s"]),
        "step_ms": 1000 * statistics.median(run["step_s"][later]),
        "faults": statistics.mean(run["faults"][later]),
        "peak_mib": run["peak_mib"],
        "resident_mib": statistics.median(run["resident_mib"][later]),
        "end_mib": run["resident_mib"][-1],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`summary` as a Markdown table, one run a line."""
    lines = [
        "| heap | run, s | median step, ms | faults a step | peak, MB | resident (median), MB"
        " | resident at end, MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['setting']} | {row['total_s']:.1f} | {row['step_ms']:.1f}"
            f" | {row['faults']:.0f} | {row['peak_mib']:,.0f} | {row['resident_mib']:,.0f}"
            f" | {row['end_mib']:,.0f} |"
        )
    return "\n".join(lines)


def measure(shapes: Shapes, setting: str) -> dict[str, Any]:
    """One run of ``shapes`` in a fresh process under ``setting`` (a key of ``SETTINGS``)."""
    env = worker_env(**{KEEP_LARGE_BLOCKS_SWITCH: SETTINGS[setting]})
    child = [sys.executable, "-m", "bench.heap_shapes", "--child", *_flags(shapes)]
    # The child's progress and errors go straight to this process's stderr.
    out = subprocess.run(child, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"heap_shapes: the {setting} run failed (exit {out.returncode}; above)")
    run = json.loads(out.stdout)
    if run["keeps_large_blocks"] != (setting == "kept"):
        # A GLIBC_TUNABLES of the caller's own can keep glibc's per-thread cache on.
        raise SystemExit(
            f"heap_shapes: the {setting} run's allocator did not match its setting; run it"
            " without a glibc.malloc.tcache_count of your own in GLIBC_TUNABLES"
        )
    return summary(setting, run)


def _flags(shapes: Shapes) -> list[str]:
    """The command-line flags that give a child process ``shapes``."""
    return [
        f"--steps={shapes.steps}",
        f"--max-batch={shapes.max_batch}",
        f"--max-seq={shapes.max_seq}",
        f"--width={shapes.width}",
        f"--seed={shapes.seed}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.heap_shapes", description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-seq", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs, order alternated")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 3 or args.max_batch < 1 or args.max_seq < 16 or args.repeats < 1:
        parser.error("--steps must be at least 3, --max-seq 16, --max-batch and --repeats 1")
    shapes = Shapes(args.steps, args.max_batch, args.max_seq, args.width, args.seed)
    if args.child:
        print(json.dumps(train(shapes)))
        return
    rows = []
    for pair in range(args.repeats):
        order = list(SETTINGS) if pair % 2 == 0 else list(reversed(SETTINGS))
        for setting in order:
            print(f"pair {pair + 1}/{args.repeats}: {setting} ...", file=sys.stderr, flush=True)
            rows.append(measure(shapes, setting))
    print(table(rows))


if __name__ == "__main__":
    main()
