"""``python -m bench.snapshot``: what a CRIU process snapshot costs (issue 16, transparent mode).

For a torch training process (tests/scripts/park_mlp.py: an MLP with Adam) holding about
``--sizes`` MB of tracked state (weights + Adam's moments, 12 bytes a parameter, as in
``bench.checkpoint``), parked at a step boundary: the dump time, the image bytes and the
restore time, for a clone (``dump --leave-running``, restore in a fresh PID namespace) and a
migration (dump, CRIU kills the worker, restore), ``--repeats`` times each; every copy is
checked to go on with the reference losses. Prints a markdown section for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.checkpoint import BYTES_PER_PARAM
from bench.procs import resident_mib
from tests.snapshots import TOKEN, output, start_worker
from torchrelay.transparent import cloner, criu
from torchrelay.transparent.park import Instruction, Kind

STEPS, PARK_AT = 4, 2


def hidden_for(megabytes: float) -> int:
    """The hidden width of park_mlp.py's MLP (about hidden^2 parameters) for ``megabytes``."""
    return int((megabytes * 1e6 / BYTES_PER_PARAM) ** 0.5)


def one(move: str, hidden: int, work: Path, reference: list[str]) -> dict[str, float]:
    worker = start_worker("park_mlp.py", str(STEPS), str(PARK_AT), str(hidden))
    parked = worker.park()
    rss = resident_mib(parked.pid)
    copy = getattr(cloner, move)(parked, work)
    copy.channel.instruct(copy.notice, Instruction(Kind.BECOME, 1, slot=1), TOKEN)
    if move == "clone":
        worker.channel.instruct(parked.notice, Instruction(Kind.CONTINUE, 1), TOKEN)
    output(worker.process)
    lines, status = output(copy.process)
    steps = [line for line in lines if line.startswith("step ")]
    if status != 0 or steps != reference[PARK_AT:]:
        raise SystemExit(f"bench.snapshot: the {move} did not go on exactly: {lines[-3:]}")
    for channel in (worker.channel, copy.channel):
        channel.close()
    return {
        "rss_mb": rss,
        "image_mb": copy.bytes / 1e6,
        "dump_s": copy.dump_seconds,
        "restore_s": copy.restore_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[15.0, 100.0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tool = criu.find_criu()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        for size in args.sizes:
            hidden = hidden_for(size)
            ref_lines, _ = output(
                start_worker("park_mlp.py", str(STEPS), "-1", str(hidden)).process
            )
            reference = [line for line in ref_lines if line.startswith("step ")]
            for move in ("clone", "migrate"):
                runs = [one(move, hidden, Path(tmp), reference) for _ in range(args.repeats)]
                med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                rows.append((size, move, med, max(r["dump_s"] for r in runs)))
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"- command: `python -m bench.snapshot --repeats {args.repeats}`, {stamp}")
    print(
        f"- machine: `nproc` = {os.cpu_count()}, {platform.platform()}, load average "
        f"{os.getloadavg()[0]:.1f}; torch {torch.__version__}, CRIU {tool.version}"
    )
    print()
    print("| state MB | move | process RSS MB | image MB | dump s (max) | restore s |")
    print("|---|---|---|---|---|---|")
    for size, move, med, worst in rows:
        print(
            f"| {size:g} | {move} | {med['rss_mb']:.0f} | {med['image_mb']:.0f} | "
            f"{med['dump_s']:.2f} ({worst:.2f}) | {med['restore_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
