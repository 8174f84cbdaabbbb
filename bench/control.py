"""``python -m bench.control``: the controller's decisions at scale (issue 10, item 6).

For each scale in ``--nodes``, a real controller and its gRPC control server run in a child
process, as in a job (the monitor included); this process plays N node agents x 8 ranks and
``--spares`` spares per node over the real control RPCs with the job token
(:mod:`bench.control_sim`). Once every rank heartbeats, the heartbeat load is measured for
``--steady`` seconds; then ``--failures`` ranks on remote nodes are reported dead one after
another, each once the previous recovery is done. Measured per scale:

- failure report -> plan on every survivor's Watch stream, p50/p99 (and the controller's own
  ``failure`` -> ``recovery_planned`` in its ledger);
- the controller process's CPU (cores used while steady, CPU seconds per failure) and RSS;
- heartbeats: offered and handled per second, latency p50/p99, how many missed their 2 s
  deadline.

``--state etcd`` starts a real etcd per scale and has the controller lead the job there, as
``torchrelay run --state etcd://...`` does. ``--beat-interval`` measures what a proposed change
would give (heartbeats every 4 s have the RPC rate of node agents that carry their ranks'
progress in their own heartbeats); ``--unary heartbeats,reports,node-heartbeats`` has ranks send
their reports, and node agents their heartbeats, with a call each, as before their streams.

A scale stops cleanly, and the sweep with it, when over 1 % of heartbeats miss their deadline,
a report is refused, the controller records hangs, lost nodes or the job's end (it cannot keep
up), or setup or a recovery outlasts ``--timeout``. :func:`measure` is what
``tests/test_bench_control.py`` runs; results go to ``--json`` and a table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.control_ledger import Stopped
from bench.control_report import summary, table, usage
from bench.control_sim import PER_NODE, Cluster, Failure
from bench.procs import REPO_ROOT
from tests.etcd import start_etcd
from torchrelay.control.lease import HEARTBEAT_INTERVAL
from torchrelay.control.report_stream import Lane

# More heartbeats than this share missing their deadline: the controller cannot keep up (a
# worker survives a few, its lease is 2 hang timeouts; more and hangs get declared).
MISSED_LIMIT = 0.01


class LocalAgent:
    """Node 0's agent inside the controller's process: it asks the bench (on stdout) to start
    a spare; a signal needs no act here (the bench fails only remote nodes' ranks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def start_spare(self) -> None:
        with self._lock:
            print(json.dumps({"start_spare": True}), flush=True)

    def kill(self, process: str, signum: int = 9, stacks: bool = False) -> None:
        del process, signum, stacks


def serve(run_dir: Path, nodes: int, spares: int, state: str) -> None:
    """The child: a controller for ``nodes`` x 8 ranks, its server and monitor, until killed;
    with ``state`` an ``etcd://`` URL, it leads the job there and writes its state as a job's
    controller does (``--state``)."""
    from torchrelay.config import JobConfig
    from torchrelay.control.controller import Controller
    from torchrelay.control.persistence import take_lead
    from torchrelay.control.service import ControlServer
    from torchrelay.control.store.url import parse_store_url
    from torchrelay.control.wire import new_token
    from torchrelay.ledger import Ledger

    config = JobConfig(
        script="bench",
        script_args=[],
        nproc_per_node=PER_NODE,
        nnodes=nodes,
        spares=spares,
        run_dir=run_dir,
        state=parse_store_url(state),
    )
    token = new_token()
    persister = take_lead(config.state, token, candidate="bench.control")
    ledger = Ledger(run_dir / "ledger.jsonl")
    controller = Controller(config, ledger, LocalAgent(), persister=persister)
    server = ControlServer(controller, token)
    server.start()
    controller.start_monitor()
    print(json.dumps({"address": server.address, "token": token}), flush=True)
    controller.wait_finished()


@dataclass
class Options:
    """How each scale is run (the command-line options)."""

    spares: int = 1  # per node, as ``--spares``
    failures: int = 10
    steady: float = 10.0  # seconds of heartbeats timed
    timeout: float = 300.0  # setup, and each recovery, must end within
    timings: bool = True  # heartbeats carry step timings, as after a rank's first step
    beat_interval: float = HEARTBEAT_INTERVAL  # a rank's heartbeat period
    state: str = "memory"  # or "etcd": a real etcd started for the scale (``--state``)
    unary: tuple[str, ...] = ()  # lanes (Lane values) whose reports are a call each
    seed: int = 0


def measure(nodes: int, options: Options) -> dict[str, Any]:
    """One scale: start the controller, drive the cluster, return the figures (see module)."""
    with tempfile.TemporaryDirectory() as run_dir, contextlib.ExitStack() as stack:
        command = [sys.executable, "-m", "bench.control", "--serve", run_dir]
        command += ["--nodes", str(nodes), "--spares", str(options.spares)]
        etcd = None
        if options.state == "etcd":
            etcd = start_etcd(Path(run_dir) / "etcd", fast_election=False)
            stack.callback(etcd.kill)
            command += ["--state", etcd.url]
        # This checkout's bench and torchrelay, wherever the caller runs from.
        path = os.pathsep.join(
            [str(REPO_ROOT / "src"), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
        )
        env = {**os.environ, "PYTHONPATH": path}
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
        try:
            assert child.stdout is not None
            endpoint = json.loads(child.stdout.readline())
            idle_cpu, idle_rss = usage(child.pid)
            result = asyncio.run(_drive(child, endpoint, Path(run_dir), nodes, options))
            if etcd is not None:
                cpu, rss = usage(etcd.proc.pid)
                result["etcd"] = {"cpu_s": cpu, "rss_mib": rss}
        finally:
            child.kill()
            child.wait()
    result["options"] = asdict(options)
    controller = result.setdefault("controller", {})
    controller.update(idle_rss_mib=idle_rss, setup_cpu_s=result.pop("setup_cpu") - idle_cpu)
    if "rss_mib" in controller:  # what the job's state and streams added, per rank
        controller["rss_kib_per_rank"] = (
            1024 * (controller["rss_mib"] - idle_rss) / (PER_NODE * nodes)
        )
    return result


async def _drive(
    child: subprocess.Popen[str],
    endpoint: dict[str, str],
    run_dir: Path,
    nodes: int,
    options: Options,
) -> dict[str, Any]:
    load = [os.getloadavg()[0]]
    ledger = run_dir / "ledger.jsonl"
    cluster = Cluster(
        endpoint["address"],
        endpoint["token"],
        nodes,
        options.spares,
        ledger,
        options.timings,
        options.beat_interval,
        frozenset(Lane(lane) for lane in options.unary),
    )
    loop = asyncio.get_running_loop()

    def relay_agent() -> None:  # node 0's agent asks for spares on the child's stdout
        assert child.stdout is not None
        for _ in child.stdout:
            try:
                loop.call_soon_threadsafe(cluster.start_local_spare)
            except RuntimeError:  # the loop closed: the run is over, the request too late
                return

    threading.Thread(target=relay_agent, daemon=True).start()
    ranks = nodes * PER_NODE
    result: dict[str, Any] = {"ranks": ranks, "nodes": nodes, "spares_per_node": options.spares}
    started = time.perf_counter()
    try:
        try:
            await asyncio.wait_for(cluster.start(), options.timeout)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            result["status"] = f"stopped: setup took over {options.timeout:.0f} s"
            return result
        except grpc.aio.AioRpcError as exc:  # e.g. a rank fenced: its node was declared lost
            why = f"{exc.code().name} {exc.details()}; {_trouble(cluster)}"
            result["status"] = f"stopped during setup: {why}"
            return result
        finally:
            result["setup_s"] = time.perf_counter() - started
            result["setup_cpu"], _ = usage(child.pid)
        await asyncio.sleep(2 * HEARTBEAT_INTERVAL)  # every rank has had its first heartbeat
        result.update(
            _steady_figures(child.pid, cluster, await _record(child.pid, cluster, options.steady))
        )
        trouble = _trouble(cluster)
        if trouble is not None:
            result["status"] = f"stopped: {trouble}"
            return result
        result["failures"] = await _failures(child.pid, cluster, options)
        stopped = result["failures"].pop("stopped") or _trouble(cluster)
        result["status"] = "ok" if stopped is None else f"stopped: {stopped}"
        return result
    finally:
        load.append(os.getloadavg()[0])
        result["loadavg_1min"] = load
        await cluster.close()


async def _record(pid: int, cluster: Cluster, seconds: float) -> tuple[float, float]:
    """Record heartbeats for ``seconds``; the controller's CPU seconds and wall time spent."""
    cpu, _ = usage(pid)
    began, own = time.perf_counter(), time.process_time()
    cluster.beats.recording = True
    await asyncio.sleep(seconds)
    cluster.beats.recording = False
    cluster.beats.bench_cpu = time.process_time() - own
    return usage(pid)[0] - cpu, time.perf_counter() - began


def _steady_figures(pid: int, cluster: Cluster, spent: tuple[float, float]) -> dict[str, Any]:
    cpu, wall = spent
    beats = cluster.beats
    _, rss = usage(pid)
    offered = len(cluster.ranks) / cluster.beat_interval
    offered += (len(cluster.nodes) - 1) / HEARTBEAT_INTERVAL
    handled = len(beats.latencies) + len(beats.node_latencies)
    return {
        "processes": len(cluster.ranks),
        "heartbeats": {
            "offered_per_s": offered,
            "handled_per_s": handled / wall,
            "rank_latency_ms": summary(beats.latencies),
            "node_latency_ms": summary(beats.node_latencies),
            "timed_out": beats.timed_out,  # since the start, as "sent"
            "sent": beats.sent,
        },
        # The simulated cluster's own CPU: it shares this machine's cores with the controller.
        "bench_cores": beats.bench_cpu / wall,
        "controller": {
            "steady_cores": cpu / wall,
            "cpu_ms_per_heartbeat": 1000 * cpu / max(1, handled),
            "rss_mib": rss,
        },
    }


def _trouble(cluster: Cluster) -> str | None:
    beats = cluster.beats
    if beats.timed_out > MISSED_LIMIT * beats.sent:
        return (
            f"{beats.timed_out} of {beats.sent} heartbeats missed their 2 s deadline "
            "(cannot keep up)"
        )
    if beats.refused:
        return f"{len(beats.refused)} reports refused, first: {beats.refused[0]}"
    return cluster.ledger.trouble()


async def _failures(pid: int, cluster: Cluster, options: Options) -> dict[str, Any]:
    rng = random.Random(options.seed)
    timed: list[Failure] = []
    cpu, _ = usage(pid)
    stopped = None
    for _ in range(options.failures):
        await asyncio.sleep(1.0)  # heartbeats back to steady state between failures
        stopped = _trouble(cluster)
        if stopped is not None:
            break
        candidates = sorted(
            r.process
            for r in cluster.ranks.values()
            if r.alive and r.slot is not None and r.node != cluster.nodes[0]
        )
        try:
            timed.append(await cluster.fail(rng.choice(candidates), options.timeout))
        except (TimeoutError, Stopped, grpc.aio.AioRpcError) as exc:
            stopped = _trouble(cluster) or f"a recovery did not complete: {exc!r}"
            break
    cpu = usage(pid)[0] - cpu
    ledger = cluster.ledger.events
    failed_at = {e["process"]: e["t"] for e in ledger if e["event"] == "failure"}
    planned_at = [e["t"] for e in ledger if e["event"] == "recovery_planned"]
    return {
        "count": len(timed),
        "report_to_abort_ms": summary([f.aborted - f.sent for f in timed]),
        "report_to_plan_first_ms": summary([f.planned_first - f.sent for f in timed]),
        "report_to_plan_ms": summary([f.planned - f.sent for f in timed]),
        "controller_failure_to_planned_ms": summary(
            [p - failed_at[f.process] for f, p in zip(timed, planned_at, strict=False)]
        ),
        "report_to_recovery_done_ms": summary([f.done - f.sent for f in timed]),
        "controller_cpu_s_per_failure": cpu / max(1, len(timed)),
        "stopped": stopped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.control", description=__doc__)
    parser.add_argument("--nodes", default="8,128,512,2048", help="comma-separated node counts")
    parser.add_argument("--spares", type=int, default=1, help="spares per node (as --spares)")
    parser.add_argument("--failures", type=int, default=10, help="failures per scale")
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of heartbeats timed")
    parser.add_argument("--timeout", type=float, default=300.0, help="setup / recovery limit")
    parser.add_argument(
        "--no-timings",
        action="store_true",
        help="heartbeats without step timings (as before a rank's first timed step)",
    )
    parser.add_argument(
        "--beat-interval",
        type=float,
        default=HEARTBEAT_INTERVAL,
        help="seconds between a rank's heartbeats (workers: 0.5; 4.0 gives the RPC rate of "
        "heartbeats aggregated per 8-rank node agent)",
    )
    parser.add_argument(
        "--unary",
        default="",
        help="comma-separated lanes (heartbeats, reports, node-heartbeats) whose reports the "
        "simulated processes send with a call each, as before their streams, for comparison",
    )
    parser.add_argument(
        "--state",
        default="memory",
        help="memory, etcd (a real etcd is started for each scale), or, with --serve, a URL",
    )
    parser.add_argument("--keep-going", action="store_true", help="sweep on after a stop")
    parser.add_argument("--json", type=Path, default=Path("control.json"))
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, int(args.nodes), args.spares, args.state)
        return
    try:
        scales = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        parser.error(f"--nodes takes comma-separated node counts, not {args.nodes!r}")
    if min(scales) < 2 or args.failures < 0:
        parser.error("every scale needs 2 or more nodes (failures hit remote nodes' ranks)")
    unary = tuple(lane for lane in args.unary.split(",") if lane)
    lanes = [lane.value for lane in Lane]
    if any(lane not in lanes for lane in unary):
        parser.error(f"--unary takes lanes among {', '.join(lanes)}, not {args.unary!r}")
    results: list[dict[str, Any]] = []
    for nodes in scales:
        print(f"{nodes} nodes x {PER_NODE} ranks ...", flush=True)
        options = Options(
            args.spares,
            args.failures,
            args.steady,
            args.timeout,
            timings=not args.no_timings,
            beat_interval=args.beat_interval,
            state=args.state,
            unary=unary,
        )
        results.append(measure(nodes, options))
        args.json.write_text(json.dumps(results, indent=1))
        print(table(results[-1:]).splitlines()[-1], flush=True)
        if results[-1]["status"] != "ok" and not args.keep_going:
            break
    print(table(results))
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
