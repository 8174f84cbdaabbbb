"""``torchrelay chaos overheat``, ``torchrelay drain`` and ``torchrelay uncordon``: the operator's
side of health.

``drain`` moves a rank (or every rank of a node) to spares at a step boundary, with no step
redone (see :mod:`torchrelay.control.handover`), and quarantines nothing: after maintenance the
node simply serves spares again.

``chaos overheat`` writes a health injection (:mod:`torchrelay.health.inject`) into the run
directory: with ``--rank`` for the process that serves that slot now (the job must be running,
to say which process and node that is), with ``--node N --device D`` for a device (no job
needed). ``uncordon`` clears a quarantine entry so that spares may use the device again.
Neither loads torch, nor (without ``--rank``) talks to the job.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchrelay.health.inject import InjectionError, inject
from torchrelay.health.quarantine import QuarantineError, cleared, update


def add_overheat(faults: argparse._SubParsersAction) -> None:
    overheat = faults.add_parser(
        "overheat",
        help="make a slot's GPU read hot (a health injection in the run directory), so the "
        "health policy moves its worker to a spare",
    )
    where = overheat.add_mutually_exclusive_group(required=True)
    where.add_argument("--rank", type=int, help="the process serving this slot (job running)")
    where.add_argument("--node", type=int, help="a node, with --device (no job needed)")
    overheat.add_argument("--device", type=int, help="the device index on --node")
    overheat.add_argument("--celsius", type=float, default=95.0, help="default: 95")


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    drain = subparsers.add_parser(
        "drain",
        help="move a rank, or every rank of a node, to spares at a step boundary (maintenance, "
        "a straggler): nothing is redone",
    )
    drain.add_argument("--run-dir", type=Path, required=True, help="the job's --run-dir")
    what = drain.add_mutually_exclusive_group(required=True)
    what.add_argument("--rank", type=int)
    what.add_argument("--node", type=int)
    drain.set_defaults(func=run_drain)
    uncordon = subparsers.add_parser(
        "uncordon",
        help="clear a quarantined device (or node) so that spares may use it again",
    )
    uncordon.add_argument("--run-dir", type=Path, required=True, help="the job's --run-dir")
    uncordon.add_argument("--node", type=int, required=True)
    uncordon.add_argument(
        "--device", type=int, help="the device index (leave out to clear the node's own entry)"
    )
    uncordon.set_defaults(func=run_uncordon)


def run_overheat(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        raise SystemExit(f"torchrelay chaos overheat: no run directory {args.run_dir}")
    entry: dict[str, Any]
    if args.rank is not None:
        if args.device is not None:
            raise SystemExit("torchrelay chaos overheat: --device goes with --node, not --rank")
        from torchrelay.cli.operator import job_status

        status = job_status(args.run_dir)
        slots = {m["slot"]: m for m in status["slots"]}
        if args.rank not in slots:
            raise SystemExit(
                f"torchrelay chaos overheat: no rank {args.rank} "
                f"(world size {status['world_size']})"
            )
        node, process = slots[args.rank]["node"], slots[args.rank]["process"]
        entry, what = {"process": process, "slot": args.rank}, f"{process} (rank {args.rank})"
    else:
        if args.device is None:
            raise SystemExit("torchrelay chaos overheat: --node needs --device")
        node, entry = f"node{args.node}", {"device": args.device}
        what = f"device {args.device}"
    entry["temperature_c"] = args.celsius
    try:
        path = inject(args.run_dir, node, entry)
    except (InjectionError, OSError) as exc:
        raise SystemExit(f"torchrelay chaos overheat: {exc}") from None
    print(
        f"overheat: {what} on {node} reads {args.celsius:.0f} C from now on "
        f"(health injection {path}; delete it to end the drill)"
    )
    return 0


def run_drain(args: argparse.Namespace) -> int:
    from torchrelay.cli.operator import ask_status, connect

    client = connect(args.run_dir)
    from torchrelay.control.client import ControlError  # loaded by connect()

    try:
        status = ask_status(client)
        if args.rank is not None:
            slots = {m["slot"]: m for m in status["slots"]}
            if args.rank not in slots:
                raise SystemExit(
                    f"torchrelay drain: no rank {args.rank} (world size {status['world_size']})"
                )
            target = slots[args.rank]["process"]
        else:
            target = f"node{args.node}"
        done = client.chaos("drain", target)
    except ControlError as exc:
        raise SystemExit(f"torchrelay drain: refused: {exc.message}") from None
    finally:
        client.close()
    ranks = ", ".join(map(str, done["slots"]))
    print(
        f"draining {target}: rank(s) {ranks} move to spares at the next step boundary "
        "(`torchrelay status` shows it; the ledger records handover_done)"
    )
    return 0


def run_uncordon(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        raise SystemExit(f"torchrelay uncordon: no run directory {args.run_dir}")
    node = f"node{args.node}"
    try:
        left = update(args.run_dir, lambda q: cleared(q, node, args.device))
    except (QuarantineError, OSError) as exc:
        raise SystemExit(f"torchrelay uncordon: {exc}") from None
    what = node if args.device is None else f"{node} device {args.device}"
    print(f"uncordoned {what}; {len(left.entries)} quarantined left")
    return 0
