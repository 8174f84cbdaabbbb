"""``torchrelay run --elastic [--min-nproc N]``, ``torchrelay shrink`` and ``torchrelay grow``.

An ``--elastic`` job that loses a slot with no spare in sight carries on with one process
fewer, the global batch unchanged (docs/elastic.md). ``shrink`` releases a rank's process at
the next step boundary (what a pool will ask of a lower-priority job); ``grow`` starts one
spare, onto which a hosted rank moves back at a step boundary once it is ready.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="when a rank is lost and no spare can come, carry on with one process fewer: a "
        "survivor also runs the lost rank's micro-batches (same global batch and math; "
        "docs/elastic.md); grows back when a spare is ready",
    )
    parser.add_argument(
        "--min-nproc",
        type=int,
        default=None,
        metavar="N",
        help="with --elastic: never shrink below N processes (default 1); below it the job "
        "stops as without --elastic",
    )


def check_run_flags(args: argparse.Namespace, world_size: int) -> tuple[bool, int]:
    """``(elastic, min_nproc)`` from the flags; ``SystemExit`` with one line if refused."""
    if args.min_nproc is not None and not args.elastic:
        raise SystemExit("torchrelay run: --min-nproc needs --elastic")
    if not args.elastic:
        return False, 1
    if world_size < 2:
        raise SystemExit(
            "torchrelay run: --elastic needs 2 or more processes (a job of 1 cannot shrink)"
        )
    minimum = 1 if args.min_nproc is None else args.min_nproc
    if not 1 <= minimum <= world_size:
        raise SystemExit(
            f"torchrelay run: --min-nproc must be in [1, {world_size}] (the world size), "
            f"not {minimum}"
        )
    if args.checkpoint_dir is not None:
        raise SystemExit(
            "torchrelay run: --elastic does not combine with --checkpoint-dir yet (a hosted "
            "rank's checkpoint part has no writer); use one or the other"
        )
    return True, minimum


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    shrink = subparsers.add_parser(
        "shrink",
        help="release a rank's process of an --elastic job at the next step boundary",
        description="Release the process of --rank at the next step boundary: it leaves and "
        "a survivor runs that rank's micro-batches too, the global batch unchanged. Refused "
        "without --elastic, below --min-nproc, or while a recovery or handover is under way.",
    )
    shrink.add_argument("--run-dir", type=Path, required=True, help="the job's --run-dir")
    shrink.add_argument("--rank", type=int, required=True)
    shrink.set_defaults(func=run_shrink)
    grow = subparsers.add_parser(
        "grow",
        help="start one spare for an --elastic job; a hosted rank moves onto it",
        description="Start one spare process; once it is ready, a rank hosted by another "
        "process moves onto it at a step boundary, receiving the state from the replicas.",
    )
    grow.add_argument("--run-dir", type=Path, required=True, help="the job's --run-dir")
    grow.set_defaults(func=run_grow)


def _ask(run_dir: Path, command: str, fault: str, rank: int | None) -> dict:
    from torchrelay.cli.operator import ask_status, connect

    client = connect(run_dir)
    from torchrelay.control.client import ControlError  # loaded by connect()

    try:
        target = "job"
        if rank is not None:
            status = ask_status(client)
            slots = {m["slot"]: m for m in status["slots"]}
            if rank not in slots:
                raise SystemExit(
                    f"torchrelay {command}: rank {rank} has no process of its own (world size "
                    f"{status['world_size']}, hosted: {sorted(status.get('hosted', {}))})"
                )
            target = slots[rank]["process"]
        return client.chaos(fault, target)
    except ControlError as exc:
        raise SystemExit(f"torchrelay {command}: refused: {exc.message}") from None
    finally:
        client.close()


def run_shrink(args: argparse.Namespace) -> int:
    done = _ask(args.run_dir, "shrink", "shrink", args.rank)
    print(
        f"releasing rank {done['shrink']} ({done['process']}) at the next step boundary; a "
        "survivor hosts it (the ledger records job_shrunk)"
    )
    return 0


def run_grow(args: argparse.Namespace) -> int:
    done = _ask(args.run_dir, "grow", "add-spare", None)
    hosted = done["hosted"]
    then = (
        f"hosted rank(s) {hosted} move onto spares once ready (job_grown)"
        if hosted
        else "no rank is hosted now: it waits as a spare"
    )
    print(f"starting a spare ({done['spares_in_sight']} in sight); {then}")
    return 0
