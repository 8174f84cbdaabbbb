"""``torchrelay pool`` (the service), the ``run --pool`` flags and ``status --pool``.

``torchrelay pool --slots N --token-file F [--listen HOST:PORT] [--state URL]`` owns N slots
and serves them until SIGTERM / Ctrl-C; it writes its address to ``--address-file`` if given.
The token file is created (mode 0600, a fresh random token) when it does not exist; every job
and operator reads the same file (``--pool-token``). See docs/pool.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from torchrelay.config import PoolSpec


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pool",
        metavar="HOST:PORT",
        default=None,
        help="take this job's slots and spares from a `torchrelay pool` (needs --pool-token "
        "and --spares 0): a lost process is replaced on an idle slot, or on one borrowed from "
        "a lower-priority job, which shrinks (--elastic) or parks whole (docs/pool.md)",
    )
    parser.add_argument("--pool-token", type=Path, default=None, help="the pool's token file")
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="with --pool: higher borrows from lower (default 0)",
    )
    parser.add_argument(
        "--no-park",
        action="store_true",
        help="with --pool: never park this job whole for a higher-priority one (it may still "
        "shrink if --elastic)",
    )
    parser.add_argument(
        "--job-name",
        default=None,
        help="with --pool: this job's name in the pool (default: the run directory's name)",
    )


def check_run_flags(args: argparse.Namespace, run_dir: Path) -> PoolSpec | None:
    """The pool to attach to, or ``None``; ``SystemExit`` with one line if refused."""
    if args.pool is None:
        if args.pool_token or args.priority is not None or args.job_name or args.no_park:
            raise SystemExit(
                "torchrelay run: --pool-token, --priority, --job-name, --no-park need --pool"
            )
        return None
    if args.pool_token is None:
        raise SystemExit("torchrelay run: --pool needs --pool-token FILE (the pool's token)")
    if args.state != "memory":
        raise SystemExit(
            "torchrelay run: --pool does not combine with --state etcd yet (a standby that "
            "takes over has no pool link); use one or the other"
        )
    if args.spares != 0:
        raise SystemExit(
            "torchrelay run: --pool takes its spares from the pool's idle slots: use --spares 0"
        )
    from torchrelay.pool.client import read_token

    name = args.job_name or run_dir.resolve().name
    return PoolSpec(
        args.pool, read_token(args.pool_token), name, args.priority or 0, not args.no_park
    )


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    pool = subparsers.add_parser(
        "pool",
        help="serve a pool of slots that jobs attach to (run --pool) and borrow from",
        description="Own --slots slots. Jobs attach with `torchrelay run --pool ADDR "
        "--pool-token FILE --priority N`; idle slots replace their lost processes; with none "
        "idle, a lower-priority job lends one: it shrinks at a step boundary (--elastic) or, "
        "at its minimum, parks whole there, and grows back or resumes when slots come back. "
        "Runs until SIGTERM or Ctrl-C.",
    )
    pool.add_argument("--slots", type=int, required=True, help="how many slots it owns")
    pool.add_argument("--token-file", type=Path, required=True, help="created if absent")
    pool.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free)")
    pool.add_argument("--address-file", type=Path, default=None, help="write HOST:PORT here")
    pool.add_argument("--state", default="memory", help="memory or etcd://HOST:PORT[/PREFIX]")
    pool.add_argument(
        "--max-lends",
        type=int,
        default=3,
        help="a job asked to lend this many times within --lend-window is not asked again",
    )
    pool.add_argument("--lend-window", type=float, default=3600.0, help="seconds")
    pool.set_defaults(func=run_pool)


def _token(path: Path) -> str:
    from torchrelay.control.wire import new_token
    from torchrelay.pool.client import read_token

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_token(path)
    except OSError as exc:
        raise SystemExit(f"torchrelay pool: cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as out:
        out.write(new_token() + "\n")
    return read_token(path)


def run_pool(args: argparse.Namespace) -> int:
    from torchrelay.control.store import StoreError, open_backend, parse_store_url
    from torchrelay.pool.policy import Rules
    from torchrelay.pool.service import Pool, PoolServer

    if args.slots < 1:
        raise SystemExit(f"torchrelay pool: --slots must be 1 or more, not {args.slots}")
    if args.max_lends < 1 or not args.lend_window > 0:
        raise SystemExit("torchrelay pool: --max-lends must be >= 1 and --lend-window > 0")
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"torchrelay pool: --listen must be HOST:PORT, not {args.listen!r}")
    token = _token(args.token_file)
    try:
        backend = open_backend(parse_store_url(args.state))
        backend.check()
        pool = Pool(args.slots, backend, token, Rules(args.max_lends, args.lend_window))
        server = PoolServer(pool, token, host, int(port))
    except StoreError as exc:
        raise SystemExit(f"torchrelay pool: --state {args.state}: {exc}") from None
    except (OSError, RuntimeError) as exc:
        raise SystemExit(f"torchrelay pool: cannot listen on {args.listen}: {exc}") from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    if args.address_file is not None:
        args.address_file.write_text(server.address + "\n")
    print(f"torchrelay pool: {args.slots} slot(s) on {server.address}", flush=True)
    stop.wait()
    server.stop()
    backend.close()
    return 0


def show_pool(address: str, token_file: Path | None, as_json: bool) -> int:
    """``torchrelay status --pool ADDR --pool-token FILE``: jobs, slots, loans."""
    from torchrelay.pool.client import PoolClient, PoolError, read_token

    if token_file is None:
        raise SystemExit("torchrelay status: --pool needs --pool-token FILE")
    client = PoolClient(address, read_token(token_file))
    try:
        status = client.call("Status", {})
    except PoolError as exc:
        raise SystemExit(f"torchrelay status: --pool {address}: {exc}") from None
    finally:
        client.close()
    print(json.dumps(status, indent=2) if as_json else render(status))
    return 0


def render(status: dict) -> str:
    """The pool's status as text: one line per slot owner, job and loan."""
    slots = status["slots"]
    owners = ", ".join(f"{i}:{owner or 'idle'}" for i, owner in enumerate(slots))
    lines = [f"pool: {len(slots)} slot(s): {owners}"]
    for name, job in sorted(status["jobs"].items()):
        lines.append(
            f"job {name}: priority {job['priority']}, holds {job['held']} of {job['size']} "
            f"(min {job['min_nproc']}), {job['processes']} process(es)"
            + (", recovering" if job["recovering"] else "")
            + (", parked" if job.get("parked") else "")
            + (f", waiting for {job['wanted']}" if job["wanted"] else "")
        )
    for loan in status["loans"]:
        lines.append(
            f"loan {loan['id']} ({loan.get('kind', 'shrink')}): {loan['lender']} -> "
            f"{loan['borrower']} slot {loan['slot']} "
            f"{loan['state']}" + (f" ({loan['note']})" if loan["note"] else "")
        )
    return "\n".join(lines)
