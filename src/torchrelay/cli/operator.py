"""``torchrelay status`` and ``torchrelay chaos``: look at and drill a running job.

Both find the job through its run directory (``endpoint`` and the owner-only ``token`` file
the launcher writes) and talk to its controller over the authenticated control RPC.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchrelay.cli import health

if TYPE_CHECKING:
    from torchrelay.control.client import ControlClient


def connect(run_dir: Path) -> ControlClient:
    try:
        address = (run_dir / "endpoint").read_text().strip()
        token = (run_dir / "token").read_text().strip()
    except FileNotFoundError:
        raise SystemExit(
            f"torchrelay: no running job in {run_dir} (no endpoint/token files); "
            "is the launcher running with this --run-dir?"
        ) from None
    # grpc loads here, on the way to the job, not when the parser is built.
    from torchrelay.control.client import ControlClient

    return ControlClient(address, token, process="operator")


def job_status(run_dir: Path) -> dict[str, Any]:
    client = connect(run_dir)
    try:
        return ask_status(client)
    finally:
        client.close()


def ask_status(client: ControlClient) -> dict[str, Any]:
    """The controller's status snapshot; ``SystemExit`` with one line if it does not answer."""
    from torchrelay.control.client import ControlError  # loaded by connect()

    try:
        return client.status(timeout=5.0)
    except ControlError as exc:
        raise SystemExit(
            f"torchrelay: cannot reach the job's controller ({exc}); "
            "the job has probably ended: see `torchrelay report`"
        ) from None


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    status = subparsers.add_parser(
        "status",
        help="show a running job's slots, spares, steps, recovery and recent events",
        description="Show a running job: its slots and the process filling each, generation, "
        "committed steps and step rate, spares, the recovery in progress and its step, and "
        "the ledger's recent events. --watch redraws it every --interval seconds until the "
        "job ends (or Ctrl-C).",
    )
    status.add_argument("run_dir", type=Path, nargs="?")
    status.add_argument(
        "--pool", metavar="HOST:PORT", help="show a pool instead: jobs, slots, loans"
    )
    status.add_argument("--pool-token", type=Path, help="with --pool: the pool's token file")
    how = status.add_mutually_exclusive_group()
    how.add_argument("--json", action="store_true", help="the controller's snapshot as JSON")
    how.add_argument("--watch", action="store_true", help="a live view until the job ends")
    how.add_argument("--once", action="store_true", help="the view once (the default)")
    status.add_argument(
        "--interval", type=float, default=1.0, help="seconds between redraws of --watch"
    )
    status.set_defaults(func=run_status)

    chaos = subparsers.add_parser(
        "chaos",
        help="inject a fault into a running job (operators' drill)",
        description="Inject a real fault into a running job, to prove a setup before a long "
        "run. The job must recover from each with no committed step lost. The fault is "
        "carried out by the agent on the target's node, so this works from any host that "
        "can read the run directory's endpoint and token.",
    )
    chaos.add_argument("--run-dir", type=Path, required=True, help="the job's --run-dir")
    faults = chaos.add_subparsers(dest="fault", required=True)
    kill = faults.add_parser("kill", help="SIGKILL the worker of a slot (a crashed process)")
    kill.add_argument("--rank", type=int, required=True)
    hang = faults.add_parser(
        "hang",
        help="SIGSTOP the worker of a slot (a hung process); the "
        "job must detect the silence, fence it and replace it",
    )
    hang.add_argument("--rank", type=int, required=True)
    faults.add_parser("kill-spare", help="SIGKILL one idle spare (the pool must refill)")
    kill_node = faults.add_parser(
        "kill-node",
        help="SIGKILL a node's agent and every worker and spare on it at once (a node lost "
        "to power or a kernel panic); not node 0, which hosts the controller",
    )
    kill_node.add_argument("--node", type=int, required=True)
    partition = faults.add_parser(
        "partition",
        help="drop all network traffic of a node for SECONDS (a failed link: silence, no "
        "resets); needs nftables and CAP_NET_ADMIN on that node, and a node on its own host",
    )
    where = partition.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", type=int)
    where.add_argument("--rank", type=int, help="partition the node that runs this rank")
    partition.add_argument("--seconds", type=float, required=True)
    health.add_overheat(faults)
    chaos.set_defaults(func=run_chaos)


def run_status(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.interval) and 0.1 <= args.interval <= 3600):
        raise SystemExit(
            f"torchrelay status: --interval must be 0.1 to 3600 seconds, not {args.interval}"
        )
    if args.pool is not None:
        from torchrelay.cli.pool import show_pool

        return show_pool(args.pool, args.pool_token, args.json)
    if args.run_dir is None:
        raise SystemExit("torchrelay status: give a run directory, or --pool HOST:PORT")
    client = connect(args.run_dir)
    try:
        status = ask_status(client)
        if args.json:
            print(json.dumps(status, indent=2))
            return 0
        from torchrelay.cli.watch import show  # rich loads only for the view

        return show(client, args.run_dir, status, args.watch, args.interval)
    finally:
        client.close()


def run_chaos(args: argparse.Namespace) -> int:
    if args.fault == "overheat":
        return health.run_overheat(args)
    status = job_status(args.run_dir)
    slots = {m["slot"]: m for m in status["slots"]}
    rank = getattr(args, "rank", None)
    if rank is not None and rank not in slots:
        raise SystemExit(f"torchrelay chaos: no rank {rank} (world size {status['world_size']})")
    if args.fault == "kill-spare":
        if not status["spares"]:
            raise SystemExit("torchrelay chaos: the job has no idle spare right now")
        fault, target = "kill", status["spares"][0]["process"]
    elif args.fault in ("kill", "hang"):
        fault, target = args.fault, slots[rank]["process"]
    else:
        fault = args.fault
        target = slots[rank]["node"] if rank is not None else f"node{args.node}"
        if rank is not None:
            print(f"rank {rank} runs on {target}")
    client = connect(args.run_dir)
    from torchrelay.control.client import ControlError  # loaded by connect()

    try:
        done = client.chaos(fault, target, getattr(args, "seconds", 0.0))
    except ControlError as exc:
        raise SystemExit(f"torchrelay chaos: refused: {exc.message}") from None
    finally:
        client.close()
    if "process" in done:
        sent = "SIGKILL" if fault == "kill" else "SIGSTOP"
        print(f"sent {sent} to {done['process']} (pid {done['pid']} on {done['node']})")
        return 0
    notice = done["notice"]
    if notice is None:
        raise SystemExit(
            f"torchrelay chaos: {done['node']}'s agent did not confirm the {fault} within 10 s"
        )
    if not notice["ok"]:
        raise SystemExit(f"torchrelay chaos: {done['node']} refused: {notice['error']}")
    what = (
        f"dropping all traffic on {', '.join(notice['interfaces'])} for {args.seconds:.0f} s"
        if fault == "partition"
        else "killing every process of the node"
    )
    print(
        f"{fault}: {done['node']} is {what}; the job declares a silent node lost after "
        f"{done['node_timeout']:.0f} s (see `torchrelay status` and `report`)"
    )
    return 0
