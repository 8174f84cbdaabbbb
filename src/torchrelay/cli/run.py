"""``torchrelay run``: the torchrun-compatible launcher."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from torchrelay.agent.native_build import ensure_native
from torchrelay.agent.slurm import Placement, SlurmError, place, slurm_step
from torchrelay.chaos import ChaosSpecError, parse_schedule
from torchrelay.cli import elastic as elastic_flags
from torchrelay.cli import pool as pool_flags
from torchrelay.cli import torchrun_flags, torchrun_output
from torchrelay.cli.checkpoint_flags import checkpoint_every, choose_resume, export_key
from torchrelay.cli.run_checks import (
    check_durations,
    check_state_store,
    check_transparent,
    health_poll,
)
from torchrelay.config import JobConfig
from torchrelay.control.store import StoreError, parse_store_url
from torchrelay.health.policy import HealthPolicy, PolicyError, load_policy
from torchrelay.health.poller import DEFAULT_INTERVAL as DEFAULT_HEALTH_POLL
from torchrelay.report.summary import render_text, summarize

MAX_PROCESSES = 256
"""Upper bound on ``--nproc-per-node`` and on ``--spares``: each is a Python process holding a
communicator, a heartbeat stream and (on a GPU node) a device. The largest nodes have 8 to 16
accelerators; 256 leaves room for CPU-only jobs, and stops a typo (``--spares 10000``) from
flooding the host with processes."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="launch a training script (torchrun-compatible) with live recovery",
        description="Launch SCRIPT on this node with hot spares; a failed worker is rebuilt "
        "on a spare from its live data-parallel replicas and training resumes at the next step.",
    )
    p.add_argument(
        "--nnodes",
        type=torchrun_flags.nodes,
        default=None,
        help="number of nodes (N, or N:N as in torchrun); node 0 hosts the controller "
        "(default: 1, or the srun step's)",
    )
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=torchrun_flags.processes,
        default=1,
        help="workers per node (one per slot): a number, or as in torchrun gpu, cpu or auto",
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=None,
        help="this node's index (default: 0, or SLURM_NODEID under srun)",
    )
    p.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        dest="rdzv_endpoint",
        default=None,
        help="HOST:PORT of the job's store, hosted by node 0; PORT 0: any free port "
        "(default: 127.0.0.1:0, or under srun with several nodes the step's first host and "
        "a port from the job id, see docs/slurm.md)",
    )
    p.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=int,
        default=3,
        help="replacements granted to failures that look like script bugs "
        "(exceptions, non-zero exits) before the job stops; as in torchrun",
    )
    p.add_argument("--spares", type=int, default=1, help="hot spare processes to keep ready")
    p.add_argument(
        "--no-template",
        "--no-spare-template",
        dest="template",
        action="store_false",
        help="start every worker and spare as a fresh interpreter, not forked from the node's "
        "template (a process that has imported torch once)",
    )
    p.add_argument(
        "--spare-timeout",
        type=float,
        default=300.0,
        help="seconds a recovery waits for a spare before the job stops",
    )
    p.add_argument(
        "--halt-timeout",
        type=float,
        default=120.0,
        help="seconds survivors get to stop their step in flight",
    )
    p.add_argument(
        "--hang-floor",
        type=float,
        default=10.0,
        help="hang timeout floor: a worker silent, or stuck inside one step, for max(this, "
        "10 x median step time) seconds is fenced and replaced; if every rank waits that long "
        "on a collective, the communicator is re-formed",
    )
    p.add_argument(
        "--node-timeout",
        type=float,
        default=10.0,
        help="a node agent unheard of for this many seconds is declared lost (its slots are "
        "refilled elsewhere); an agent that cannot reach the controller as long kills its "
        "workers, so an isolated node never comes back with stale state",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where the ledger and logs go (default: runs/<timestamp>, or runs/slurm-<jobid> "
        "under srun)",
    )
    p.add_argument(
        "--chaos",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault, e.g. kill:rank=2:step=10[:phase=backward]; actions kill, hang, "
        "freeze, stall, drop, slow, kill-node, partition (README: Fault drills; repeatable)",
    )
    p.add_argument(
        "--state",
        default="memory",
        metavar="memory|etcd://HOST:PORT[/PREFIX]",
        help="where the job's durable state and leader election live: in this launcher's "
        "memory (default), or an etcd v3 cluster, checked at launch (keys under /PREFIX, "
        "default torchrelay; one prefix per job)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, HOST being the rendezvous "
        "host (node 0 only; docs/observability.md); default 0: no metrics",
    )
    p.add_argument(
        "--health-poll",
        type=float,
        default=None,
        metavar="SECONDS",
        help="poll each node's GPU health (NVML, injected readings) this often; 0: never; "
        f"default {DEFAULT_HEALTH_POLL:g} s on a machine with NVIDIA GPUs, else 0",
    )
    p.add_argument(
        "--health-policy",
        type=Path,
        default=None,
        metavar="FILE",
        help="thresholds for moving a worker off a failing GPU (.toml/.json; docs/health.md)",
    )
    p.add_argument(
        "--drain-stragglers",
        type=int,
        default=0,
        metavar="N",
        help="hand a straggler's slot to a spare once it stayed one for N monitor rounds "
        "(4 a second); default 0: stragglers are only reported",
    )
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="write durable checkpoints of the tracked state here, asynchronously (shared by "
        "every node; docs/checkpoints.md); with --checkpoint-every",
    )
    p.add_argument(
        "--checkpoint-every",
        default=None,
        metavar="N|Ns|Nm",
        help="checkpoint every N committed steps, or every N seconds (Ns) or minutes (Nm)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the job of --run-dir (its launcher and workers gone) from the newest "
        "complete checkpoint in --checkpoint-dir; the same command plus --resume",
    )
    elastic_flags.add_run_flags(p)
    pool_flags.add_run_flags(p)
    p.add_argument(
        "--transparent",
        action="store_true",
        help="run an unmodified torchrun script (no torchrelay API): failures are cured by "
        "voiding the step in flight and rebuilding the communicator (docs/transparent.md)",
    )
    p.add_argument("--quiet", action="store_true", help="do not stream worker output")
    torchrun_flags.add_flags(p)
    torchrun_output.add_flags(p)
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=run)


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> JobConfig:
    """The job's configuration from the flags, and from ``environ`` under ``srun`` (see
    :mod:`torchrelay.agent.slurm`); ``SystemExit`` with one line for bad input."""
    try:
        placement = place(
            Placement(args.nnodes, args.node_rank, torchrun_flags.endpoint(args), args.run_dir),
            slurm_step(environ),
        )
    except SlurmError as exc:
        raise SystemExit(f"torchrelay run: {exc}") from None
    # The torchrun defaults, where neither a flag nor srun said anything.
    nnodes = 1 if placement.nnodes is None else placement.nnodes
    node_rank = 0 if placement.node_rank is None else placement.node_rank
    endpoint = "127.0.0.1:0" if placement.rdzv_endpoint is None else placement.rdzv_endpoint
    if not 0 <= node_rank < nnodes:
        raise SystemExit("torchrelay run: --node-rank must be in [0, --nnodes)")
    torchrun_flags.check_standalone(args, nnodes)
    if not 1 <= args.nproc_per_node <= MAX_PROCESSES or not 0 <= args.spares <= MAX_PROCESSES:
        raise SystemExit(
            f"torchrelay run: --nproc-per-node must be in [1, {MAX_PROCESSES}] and --spares in "
            f"[0, {MAX_PROCESSES}] (one process each; got {args.nproc_per_node} and {args.spares})"
        )
    check_durations(args)
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise SystemExit(
            f"torchrelay run: --rdzv-endpoint must be HOST:PORT with PORT in 0..65535, not "
            f"{endpoint!r}"
        )
    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    if nnodes > 1 and not 0 < int(port) < 65535:
        raise SystemExit(
            "torchrelay run: several nodes need a fixed --rdzv-endpoint HOST:PORT "
            "(the store's port, below 65535; the controller listens on PORT+1)"
        )
    if args.node_timeout <= 1.0 or args.hang_floor <= 1.0:
        raise SystemExit(
            "torchrelay run: --node-timeout and --hang-floor must exceed 1 s (heartbeats go "
            "out twice a second; shorter timeouts would fence healthy processes)"
        )
    world_size = nnodes * args.nproc_per_node
    try:
        chaos = parse_schedule(args.chaos, world_size, nnodes)
    except ChaosSpecError as exc:
        raise SystemExit(f"torchrelay run: {exc}") from None
    try:
        state = parse_store_url(args.state)
    except StoreError as exc:
        raise SystemExit(f"torchrelay run: {exc}") from None
    run_dir = torchrun_output.run_directory(args, placement.run_dir)
    try:
        policy = HealthPolicy() if args.health_policy is None else load_policy(args.health_policy)
    except PolicyError as exc:
        raise SystemExit(f"torchrelay run: {exc}") from None
    every = checkpoint_every(args, placement.run_dir is not None)
    elastic, min_nproc = elastic_flags.check_run_flags(args, world_size)
    config = JobConfig(
        script=args.script,
        script_args=script_args,
        module=args.module,
        run_id=args.rdzv_id or "",
        nproc_per_node=args.nproc_per_node,
        run_dir=run_dir,
        spares=args.spares,
        template=args.template,
        nnodes=nnodes,
        node_rank=node_rank,
        max_restarts=args.max_restarts,
        spare_timeout=args.spare_timeout,
        halt_timeout=args.halt_timeout,
        hang_floor=args.hang_floor,
        node_timeout=args.node_timeout,
        chaos=chaos,
        master_addr=host,
        master_port=int(port),
        console_ranks=torchrun_output.console_ranks(args, args.nproc_per_node),
        role=args.role,
        state=state,
        metrics_port=args.metrics_port,
        health_poll=health_poll(args.health_poll),
        drain_stragglers=args.drain_stragglers,
        health_policy=policy,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=every,
        elastic=elastic,
        min_nproc=min_nproc,
        pool=pool_flags.check_run_flags(args, run_dir),
        transparent=args.transparent,
    )
    if config.transparent:
        check_transparent(config, args.resume)
    return config


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    torchrun_flags.check_entry(config.script, config.module)
    check_state_store(config.state)
    export_key(config, args.resume)
    if args.resume:
        config.resume = choose_resume(config)
    ensure_native()  # before any worker starts: they load it, never build it
    # torch loads here, once the arguments are known to be good: `torchrelay --help`, the
    # operator commands and a mistyped flag never pay for it.
    from torchrelay.agent.fallback import next_attempt, resume_hint
    from torchrelay.agent.launcher import control_port, job_token, launch
    from torchrelay.agent.remote import RemoteNode
    from torchrelay.agent.rundir import LEDGER
    from torchrelay.agent.signals import exit_status
    from torchrelay.events import read_events

    if config.node_rank > 0:
        token = job_token(config)  # checked first: a refused node leaves no directory behind
        # Node 0 claims the run directory (agent.rundir); other nodes only write their logs.
        try:
            config.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SystemExit(
                f"torchrelay run: cannot use --run-dir {config.run_dir}: {exc.strerror}"
            ) from None
        control = f"{config.master_addr}:{control_port(config)}"
        return RemoteNode(config, control, token).run()
    outcome = launch(config)
    while (
        again := next_attempt(config, outcome, read_events(config.run_dir / LEDGER))
    ) is not None:
        config = again
        assert config.resume is not None and config.resume.manifest is not None
        print(
            f"torchrelay: {outcome['reason']}; restarting every worker from checkpoint step "
            f"{config.resume.manifest.step} ({config.resume.directory})",
            flush=True,
        )
        outcome = launch(config)
    print(render_text(summarize(config.run_dir)), flush=True)
    if outcome["status"] == "terminated":
        print(f"torchrelay: job terminated by {outcome['signal']}", flush=True)
        return exit_status(outcome["signal"])
    if outcome["status"] != "succeeded":
        if outcome.get("traceback"):
            print(outcome["traceback"], flush=True)
        print(f"torchrelay: job failed: {outcome['reason']}", flush=True)
        entry = [args.script, *args.script_args]  # the end of the command line, as given
        hint = resume_hint(config, sys.argv[2 : len(sys.argv) - len(entry)], entry)
        # A resume that failed before its first step would only be told to resume again.
        if hint is not None and (config.resume is None or outcome.get("steps_committed")):
            print(hint, flush=True)
        return 1
    return 0
