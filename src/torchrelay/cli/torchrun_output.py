"""torchrun's flags for workers' output and role on ``torchrelay run``.

Here a worker's stdout and stderr are one stream, which always goes to its log
(``RUN_DIR/logs/<process>.log``) and, unless kept off, to the console with a prefix
(:mod:`torchrelay.agent.console`): torchrun's ``--tee 3`` plus the logs.

- ``--log-dir DIR``: run directories go under DIR instead of ``runs/`` (``DIR/<time>``, or
  ``DIR/slurm-<jobid>`` under srun), as torchrun makes one directory per run under it.
- ``-t``/``--tee``: any of torchrun's values; every stream is logged and, unless redirected,
  shown.
- ``-r``/``--redirects 3`` (all local ranks) or ``0:3,2:3`` (some): that output is in the logs
  only. ``1`` or ``2`` (one of the two streams) are refused: the streams are one here.
- ``--local-ranks-filter 0,2``: the console shows only these local ranks' output (a spare's
  once it has taken such a slot).
- ``--role NAME``: the workers' ``ROLE_NAME``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

BOTH = 3
"""torchrun's ``Std.ALL``: stdout and stderr."""

Streams = int | dict[int, int]
"""torchrun's ``--redirects``/``--tee`` value: one for every local rank, or one per rank."""


def streams(value: str) -> Streams:
    """``--redirects``/``--tee``: ``0``..``3``, or ``RANK:N,...`` (an argparse type)."""
    try:
        if ":" not in value:
            return _stream(int(value))
        pairs = (pair.split(":") for pair in value.split(","))
        return {int(rank): _stream(int(std)) for rank, std in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not 0..3 or LOCAL_RANK:0..3,... (torchrun's values)"
        ) from None


def _stream(value: int) -> int:
    if not 0 <= value <= BOTH:
        raise ValueError(value)
    return value


def local_ranks(value: str) -> frozenset[int]:
    """``--local-ranks-filter``: ``0,2`` (an argparse type)."""
    try:
        ranks = frozenset(int(rank) for rank in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not LOCAL_RANK,... (e.g. 0,2)") from None
    if min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a local rank is 0 or more")
    return ranks


def add_flags(p: argparse.ArgumentParser) -> None:
    """torchrun's output and role flags (see the module doc)."""
    p.add_argument(
        "--log-dir",
        "--log_dir",
        dest="log_dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="as in torchrun: each run's directory (ledger, logs/) goes under DIR, not runs/",
    )
    p.add_argument(
        "-r",
        "--redirects",
        type=streams,
        default=0,
        metavar="N",
        help="as in torchrun: 3 (or LOCAL_RANK:3,...) keeps that output in the logs only; "
        "stdout and stderr are one stream here",
    )
    p.add_argument(
        "-t",
        "--tee",
        type=streams,
        default=0,
        metavar="N",
        help="as in torchrun: accepted; output is always in RUN_DIR/logs/ and, unless "
        "redirected, on the console",
    )
    p.add_argument(
        "--local-ranks-filter",
        "--local_ranks_filter",
        dest="local_ranks_filter",
        type=local_ranks,
        default=None,
        metavar="RANKS",
        help="as in torchrun: show only these local ranks' output on the console (e.g. 0)",
    )
    p.add_argument(
        "--role",
        default="default",
        metavar="NAME",
        help="as in torchrun: the workers' ROLE_NAME (default: default)",
    )


def console_ranks(args: argparse.Namespace, nproc_per_node: int) -> frozenset[int] | None:
    """The local ranks whose output the console shows (``None``: every process's, spares'
    waiting included); ``SystemExit`` with one line for a redirect of one stream."""
    if args.quiet:
        return frozenset()
    redirected = set()
    for rank in range(nproc_per_node):
        redirect, tee = (_of(flag, rank) for flag in (args.redirects, args.tee))
        if redirect not in (0, BOTH):
            raise SystemExit(
                f"torchrelay run: --redirects {redirect} (local rank {rank}) sends one of "
                "stdout and stderr to the log only: here they are one stream, always in "
                "RUN_DIR/logs/; pass 3 to keep both off the console, or 0"
            )
        if redirect and not tee:
            redirected.add(rank)
    if args.local_ranks_filter is None and not redirected:
        return None
    shown = args.local_ranks_filter or frozenset(range(nproc_per_node))
    return frozenset(shown - redirected)


def _of(value: Streams, rank: int) -> int:
    return value if isinstance(value, int) else value.get(rank, 0)


def run_directory(args: argparse.Namespace, named: Path | None) -> Path:
    """The run's directory: ``named`` (``--run-dir``, or srun's ``runs/slurm-<jobid>``), else
    ``runs/<time>``; under ``--log-dir`` instead of ``runs/``. ``SystemExit`` if both
    ``--run-dir`` and ``--log-dir`` are given."""
    if args.log_dir is not None and args.run_dir is not None:
        raise SystemExit(
            "torchrelay run: --run-dir names the run's directory and --log-dir the one it goes "
            "in: pass one of them"
        )
    chosen = named or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    return chosen if args.log_dir is None else args.log_dir / chosen.name
