"""torchrun's own flags on ``torchrelay run``, so that a torchrun command line runs by changing
one word: those that mean something here map onto torchrelay's, and those that cannot are
refused in one line that says what to use instead.

- ``--nproc-per-node N``, or ``gpu`` (the CUDA devices this process sees; refused where there
  are none), ``cpu`` (the cores) or ``auto`` (``gpu`` where there are GPUs, else ``cpu``).
- ``--nnodes N`` or ``N:N``. An elastic range (``MIN:MAX``, ``MIN < MAX``) is refused: a job
  keeps its nodes, and ``--elastic`` lets survivors host lost ranks instead.
- ``--standalone``: one node, its store on a free local port, which is torchrelay's default;
  refused beside more nodes or a rendezvous address.
- ``--master-addr``/``--master-port`` (torchrun's static rendezvous): the store's address, as
  ``--rdzv-endpoint HOST:PORT`` (torchrun's 29500 where only the address is given).
- ``--rdzv-backend``: ``c10d`` and ``static``, torchrun's stores, both mean torchrelay's own
  store at the endpoint; etcd's is refused (``--state etcd://`` puts the controller's state
  there).
- ``--rdzv-id``: the job's id, given to the script as ``TORCHELASTIC_RUN_ID``, as torchrun does.
- ``-m``/``--module``: SCRIPT is a module, run as ``python -m SCRIPT``.
- ``--monitor-interval`` and ``--start-method`` are taken and change nothing: an exit is seen
  as ``waitpid`` returns, and a script is a process of its own under both launchers.
- ``--no-python``, ``--run-path`` and ``--rdzv-conf`` are refused with the reason
  (:data:`REFUSED`); the output flags are :mod:`torchrelay.cli.torchrun_output`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

STORE_BACKENDS = ("c10d", "static")
MASTER_PORT = 29500
"""torchrun's default ``--master-port``."""


def nodes(value: str) -> int:
    """``--nnodes``: ``N`` or ``N:N`` (an argparse type: a bad value is a one-line error)."""
    low, _, high = value.partition(":")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not N or N:N") from None
    if first != last:
        raise argparse.ArgumentTypeError(
            f"{value!r} is an elastic range: a torchrelay job keeps its nodes (pass one number; "
            "--elastic lets survivors host the ranks of a lost process)"
        )
    return first


def processes(value: str) -> int:
    """``--nproc-per-node``: a number, or torchrun's ``gpu``, ``cpu`` or ``auto`` (an argparse
    type: a bad value is a one-line error). Only ``gpu`` and ``auto`` import torch, to count
    the devices as a worker will see them (``CUDA_VISIBLE_DEVICES``)."""
    if value not in ("gpu", "cpu", "auto"):
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a number, gpu, cpu or auto"
            ) from None
    if value != "cpu":
        import torch

        devices = torch.cuda.device_count()
        if devices:
            return devices
        if value == "gpu":
            raise argparse.ArgumentTypeError(
                "gpu: no CUDA device is visible here (give a number of processes, or cpu)"
            )
    return os.cpu_count() or 1


def add_flags(p: argparse.ArgumentParser) -> None:
    """torchrun's flags that ``torchrelay run`` takes besides its own (see the module doc)."""
    p.add_argument(
        "--standalone",
        action="store_true",
        help="as in torchrun: one node, its store on a free local port (the default here)",
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default=None,
        help="as in torchrun: the store's host, as --rdzv-endpoint HOST:PORT",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=None,
        help=f"as in torchrun: the store's port (default {MASTER_PORT} with --master-addr)",
    )
    p.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        dest="rdzv_backend",
        default=None,
        help="as in torchrun: c10d or static, both torchrelay's own store at the endpoint",
    )
    p.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        dest="rdzv_id",
        default=None,
        help="as in torchrun: the job's id, the script's TORCHELASTIC_RUN_ID "
        "(default: the run directory's name)",
    )
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="as in torchrun: SCRIPT is a module, run as python -m SCRIPT",
    )
    p.add_argument(
        "--monitor-interval",
        "--monitor_interval",
        dest="monitor_interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="as in torchrun; no effect: an exit is seen as waitpid returns, a hang by its "
        "heartbeats (--hang-floor)",
    )
    p.add_argument(
        "--start-method",
        "--start_method",
        dest="start_method",
        choices=("spawn", "fork", "forkserver"),
        default=None,
        help="as in torchrun; no effect on a script, there as here (workers are forked from "
        "the node's template, see --no-template)",
    )
    for flags, nargs, why in REFUSED:
        p.add_argument(*flags, action=Refused, nargs=nargs, why=why, help=argparse.SUPPRESS)


class Refused(argparse.Action):
    """A torchrun flag that ``torchrelay run`` cannot honour: one line saying why."""

    def __init__(self, option_strings: list[str], dest: str, why: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.why = why

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.error(f"{self.option_strings[0]}: {self.why}")


REFUSED: tuple[tuple[tuple[str, ...], int, str], ...] = (
    (
        ("--no-python", "--no_python"),
        0,
        "a worker here is a Python process (forked from the node's template, or this "
        "interpreter run on SCRIPT): run the Python script itself, not a wrapper",
    ),
    (
        ("--run-path", "--run_path"),
        0,
        "each worker is a process of its own here, so that one can die alone: drop --run-path",
    ),
    (
        ("--rdzv-conf", "--rdzv_conf"),
        1,
        "torchrelay's store takes no rendezvous options; its timeouts are --node-timeout, "
        "--spare-timeout and --halt-timeout",
    ),
)
"""torchrun's flags refused with a reason (the others it has and this launcher lacks are
refused by argparse as unknown)."""


def endpoint(args: argparse.Namespace) -> str | None:
    """The ``--rdzv-endpoint`` that the torchrun flags in ``args`` ask for (``None``: none
    asked); ``SystemExit`` with one line where they contradict each other or ask for what
    torchrelay does not do."""
    backend = args.rdzv_backend
    if backend is not None and backend not in STORE_BACKENDS:
        raise SystemExit(
            f"torchrelay run: --rdzv-backend {backend!r}: torchrelay's rendezvous is its own "
            f"store at --rdzv-endpoint ({' or '.join(STORE_BACKENDS)} mean that); for a "
            "controller whose state survives its node, use --state etcd://HOST:PORT"
        )
    master = args.master_addr is not None or args.master_port is not None
    if master and args.rdzv_endpoint is not None:
        raise SystemExit(
            "torchrelay run: pass the store's address once, as --rdzv-endpoint HOST:PORT or as "
            "--master-addr/--master-port, not both"
        )
    if args.standalone and (master or args.rdzv_endpoint is not None):
        raise SystemExit(
            "torchrelay run: --standalone puts the store on a free local port; drop "
            "--rdzv-endpoint and --master-addr/--master-port, or --standalone"
        )
    if args.standalone:
        return "127.0.0.1:0"
    if master:
        host = "127.0.0.1" if args.master_addr is None else args.master_addr
        port = MASTER_PORT if args.master_port is None else args.master_port
        return f"{host}:{port}"
    return args.rdzv_endpoint


def check_standalone(args: argparse.Namespace, nnodes: int) -> None:
    """``--standalone`` is one node; ``SystemExit`` if the job has more."""
    if args.standalone and nnodes > 1:
        raise SystemExit(
            f"torchrelay run: --standalone is one node, not {nnodes}: drop --standalone and "
            "give node 0's --rdzv-endpoint HOST:PORT"
        )


def check_entry(script: str, module: bool) -> None:
    """``SystemExit`` if the script (``module``: the module's top-level package, found as
    ``python -m`` would find it, from the working directory first, without importing it)
    cannot be found here."""
    if not module:
        if not Path(script).is_file():
            raise SystemExit(f"torchrelay run: script {script!r} not found")
        return
    top = script.partition(".")[0]
    found = PathFinder.find_spec(top, [os.getcwd(), *sys.path]) is not None
    if not found and top not in sys.builtin_module_names:
        raise SystemExit(
            f"torchrelay run: module {script!r} not found ({top!r} is on no path: -m runs a "
            "module as python -m does; run from the directory it is in, or set PYTHONPATH)"
        )
