"""``python -m bench.exit_floor``: how long the kernel takes to end a SIGKILLed training process.

Nobody outside a process learns of its death before the kernel has torn it down: ``waitpid``
returns, a pidfd becomes readable and its sockets close (which is how its peers' collectives
fail) only after the kernel has unmapped its memory and closed its files. For a process that
has imported torch that teardown is tens of milliseconds; it is the floor under any failure
detection, torchrelay's included (``detect`` in ``bench.stall``).

Each sample starts a child that builds ``bench.workload``'s model and an AdamW optimizer, runs
one step, writes the time and SIGKILLs itself; the parent reads the time and waits for it
(``Popen.wait``: ``waitpid``). Variants show where the time goes: a bare interpreter, one that
only imported torch, and the training process, started fresh or forked from a node's template
(``agent.template``, as torchrelay starts workers and spares: the pages importing torch dirtied
are then the template's, and the kernel does not free them when the child dies; that sample is
timed to the agent's handle, the template's report included).

``--resident-gib`` adds processes holding that much written memory, each with and without
torchrelay's exit holder (:mod:`torchrelay.runtime.exit_holder`, which leaves the unmapping
to a process sharing the memory): the floor against memory, and what the holder leaves of it.

Every sample runs twice: with 4 KiB pages, and with the heap in transparent huge pages as the
node agent starts workers (:mod:`torchrelay.heap`), where the kernel unmaps 512
times fewer pages.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import worker_env
from torchrelay.agent.template import NodeTemplate
from torchrelay.heap import HUGEPAGES_SWITCH as SWITCH

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
_HOLD = """
import os
from torchrelay.runtime import exit_holder
os.environ[exit_holder.SWITCH] = "1"
assert exit_holder.start() is not None, "the runtime's C++ is not built"
"""
_RESIDENT = "import torch\nresident = torch.ones(int({gib} * 2**28))\n"
VARIANTS = {
    "bare interpreter": "",
    "import torch": "import torch\n",
    "training process ({model})": _TRAIN,
    "training process ({model}), with its exit holder": _TRAIN + _HOLD,
}


def kill_to_reaped(prelude: str, env: dict[str, str]) -> float:
    """Seconds from a child's self-SIGKILL to its parent's ``waitpid`` returning."""
    child = subprocess.Popen(
        [sys.executable, "-c", prelude + _DIE], stdout=subprocess.PIPE, env=env
    )
    assert child.stdout is not None
    killed_at = float(child.stdout.readline())
    child.wait()
    return time.time() - killed_at


def forked_kill_to_reaped(prelude: str, samples: int, env: dict[str, str]) -> list[float]:
    """:func:`kill_to_reaped` for children forked from one template, as the agent forks them."""
    with tempfile.TemporaryDirectory(prefix="exit-floor-") as tmp:
        script = Path(tmp) / "die.py"
        script.write_text(prelude + _DIE)
        template = NodeTemplate(Path(tmp) / "template.log")
        template.start(env)
        try:
            seconds = []
            for _ in range(samples):
                child = template.fork([str(script)], env)
                killed_at = float(child.stdout.readline())
                child.wait()
                seconds.append(time.time() - killed_at)
                child.stdout.close()
            return seconds
        finally:
            template.close()


def _print(label: str, seconds: list[float]) -> None:
    print(
        f"{label}: kill -> reaped {1e3 * statistics.median(seconds):.1f} ms "
        f"median ({1e3 * min(seconds):.1f}-{1e3 * max(seconds):.1f}), {len(seconds)} samples",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--model", default="small")
    parser.add_argument("--resident-gib", default="", help="e.g. 0.25,1,4 (GiB written)")
    args = parser.parse_args()
    for pages, switch in (("4 KiB pages", "0"), ("huge pages", "1")):
        env = worker_env(**{SWITCH: switch})
        for name, prelude in VARIANTS.items():
            prelude = prelude.format(model=args.model)
            seconds = [kill_to_reaped(prelude, env) for _ in range(args.samples)]
            _print(f"{name.format(model=args.model)}, {pages}", seconds)
        train = _TRAIN.format(model=args.model)
        _print(
            f"training process ({args.model}), forked from a template, {pages}",
            forked_kill_to_reaped(train, args.samples, env),
        )
        for gib in filter(None, args.resident_gib.split(",")):
            resident = _RESIDENT.format(gib=float(gib))
            for label, prelude in (("", resident), (", with its exit holder", resident + _HOLD)):
                seconds = [kill_to_reaped(prelude, env) for _ in range(args.samples)]
                _print(f"{gib} GiB resident{label}, {pages}", seconds)


if __name__ == "__main__":
    main()
