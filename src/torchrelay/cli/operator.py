"""``torchrelay status`` and ``torchrelay chaos``: look at and drill a running job.

Both find the job through its run directory (``endpoint`` and the owner-only ``token`` file
the launcher writes) and talk to its controller over the authenticated control RPC.
"""

from __future__ import annotations

import argparse
import json
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
    from torchrelay.control.client import ControlError  # loaded by connect()

    try:
        return client.status(timeout=5.0)
    except ControlError as exc:
        raise SystemExit(
            f"torchrelay: cannot reach the job's controller ({exc}); "
            "the job has probably ended: see `torchrelay report`"
        ) from None
    finally:
        client.close()


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    status = subparsers.add_parser("status", help="show a running job's slots, spares, steps")
    status.add_argument("run_dir", type=Path)
    status.add_argument("--json", action="store_true")
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
    status = job_status(args.run_dir)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"generation {status['generation']}: {status['steps_committed']} steps "
        f"committed, hang timeout {status['hang_timeout']:.1f} s"
    )
    for column in ("slot", "process", "pid", "state", "committed", "step s", "heartbeat age s"):
        table.add_column(column)
    for m in status["slots"] + status["spares"]:
        table.add_row(
            "spare" if m["slot"] is None else str(m["slot"]),
            m["process"],
            str(m["pid"]),
            m["state"],
            str(m["committed"]),
            f"{m.get('step_seconds', float('nan')):.3f}",
            f"{m['seconds_since_heartbeat']:.1f}",
        )
    Console().print(table)
    for name, node in status["nodes"].items():
        state = "alive" if node["alive"] else "LOST"
        print(f"{name}: {state}, last heartbeat {node['seconds_since_heartbeat']:.1f} s ago")
    for s in status["stragglers"]:
        print(f"straggler: slot {s['slot']} computes {s['slowdown']:.1f}x slower than its peers")
    return 0


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
