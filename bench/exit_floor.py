"""``python -m bench.exit_floor``: how long the kernel takes to end a SIGKILLed training process.

Nobody outside a process learns of its death before the kernel has torn it down: ``waitpid``
returns, a pidfd becomes readable and its sockets close (which is how its peers' collectives
fail) only after the kernel has unmapped its memory and closed its files. For a process that
has imported torch that teardown is tens of milliseconds; it is the floor under any failure
detection, torchrelay's included (``detect`` in ``bench.stall``).

Each sample starts a child that builds ``bench.workload``'s model and an AdamW optimizer, runs
one step, writes the time and SIGKILLs itself; the parent reads the time and waits for it
(``Popen.wait``: ``waitpid``). Variants show where the time goes: a bare interpreter, one that
only imported torch, and the training process.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from bench.procs import worker_env

_DIE = """
import os, signal, time
print(time.time(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
_TRAIN = """
from bench.workload import build_model, build_optimizer, loss_fn, make_batch
model = build_model({model!r})
opt = build_optimizer(model)
loss_fn(model, make_batch({model!r}, 0, 0)).backward()
opt.step()
"""
VARIANTS = {
    "bare interpreter": "",
    "import torch": "import torch\n",
    "training process ({model})": _TRAIN,
}


def kill_to_reaped(prelude: str) -> float:
    """Seconds from a child's self-SIGKILL to its parent's ``waitpid`` returning."""
    child = subprocess.Popen(
        [sys.executable, "-c", prelude + _DIE], stdout=subprocess.PIPE, env=worker_env()
    )
    assert child.stdout is not None
    killed_at = float(child.stdout.readline())
    child.wait()
    return time.time() - killed_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--model", default="small")
    args = parser.parse_args()
    for name, prelude in VARIANTS.items():
        seconds = [kill_to_reaped(prelude.format(model=args.model)) for _ in range(args.samples)]
        label = name.format(model=args.model)
        print(
            f"{label}: kill -> reaped {1e3 * statistics.median(seconds):.1f} ms "
            f"median ({1e3 * min(seconds):.1f}-{1e3 * max(seconds):.1f}), {len(seconds)} samples",
            flush=True,
        )


if __name__ == "__main__":
    main()
