"""``python -m bench.state_store``: latency of the state store, and leader takeover time.

Starts a real etcd (Debian's ``etcd-server``, default raft timings) on free loopback ports
with its data directory in ``--data-dir`` (a temporary directory on the same disk as /tmp
unless given), then measures, through :class:`torchrelay.control.store.SealedStore` (sealed
with a job token, as the controller will use it), ``--ops`` operations each of:
``get_state``, ``set_state`` (compare-and-swap on the revision just written), and
``set_state`` fenced by a held leadership; the in-memory backend the same way for contrast.
Then, per TTL in ``--ttls``, ``--repeats`` times: a child process wins the lead and is
SIGKILLed; the time from the kill to the standby (already campaigning, blocked on a watch)
winning. Prints a markdown section for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.control_plane import percentile
from tests.etcd import start_etcd
from torchrelay.control.store import SealedStore, StateBackend
from torchrelay.control.store.etcd import EtcdBackend
from torchrelay.control.store.memory import MemoryBackend
from torchrelay.control.wire import new_token

LEADER_SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "etcd_leader.py"


def _timed(op: Callable[[], object], ops: int) -> list[float]:
    times = []
    for _ in range(ops):
        started = time.perf_counter()
        op()
        times.append(time.perf_counter() - started)
    return times


def latencies(backend: StateBackend, ops: int, state_bytes: int) -> dict[str, list[float]]:
    """Seconds per call of get_state, set_state and fenced set_state on ``backend``."""
    store = SealedStore(backend, new_token())
    state = b"x" * state_bytes
    revision = store.set_state(state, store.get_state()[1])[1]
    leadership = backend.campaign("bench", 10, timeout=30)
    seen = [revision]

    def write(fence: bool) -> None:
        _, seen[0], written = store.set_state(state, seen[0], leadership if fence else None)
        assert written

    try:
        return {
            "get_state": _timed(store.get_state, ops),
            "set_state (CAS)": _timed(lambda: write(False), ops),
            "set_state (CAS, fenced)": _timed(lambda: write(True), ops),
        }
    finally:
        leadership.resign()


def takeover(port: int, ttl: int, prefix: str) -> float:
    """Seconds from SIGKILL of a leader process to a waiting standby's win."""
    child = subprocess.Popen(
        [sys.executable, str(LEADER_SCRIPT), str(port), prefix, str(ttl)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        if not line.startswith("leader "):
            raise RuntimeError(f"the leader process did not win: {line!r}")
        won: list[float] = []
        backend = EtcdBackend("127.0.0.1", port, prefix)

        def stand_by() -> None:
            leadership = backend.campaign("standby", ttl, timeout=ttl + 60)
            won.append(time.monotonic())
            leadership.resign()

        standby = threading.Thread(target=stand_by)
        standby.start()
        child.kill()
        killed = time.monotonic()
        standby.join()
        backend.close()
        return won[0] - killed
    finally:
        child.kill()
        child.wait()


def _row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"| {name} | {percentile(ms, 0.5):.2f} | {percentile(ms, 0.99):.2f} | "
        f"{max(ms):.2f} | {len(ms)} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.state_store", description=__doc__)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--state-bytes", type=int, default=4096)
    parser.add_argument("--ttls", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_etcd(args.data_dir or Path(tmp) / "etcd", fast_election=False)
        try:
            etcd = EtcdBackend("127.0.0.1", server.port, "bench-latency")
            results = {
                "etcd": latencies(etcd, args.ops, args.state_bytes),
                "memory": latencies(MemoryBackend(), args.ops, args.state_bytes),
            }
            etcd.close()
            takeovers = {
                ttl: [
                    takeover(server.port, ttl, f"bench-takeover-{ttl}-{i}")
                    for i in range(args.repeats)
                ]
                for ttl in args.ttls
            }
        finally:
            server.kill()
    load = os.getloadavg()[0]
    command = " ".join(["python -m bench.state_store", *(argv or sys.argv[1:])])
    print(f"- command: `{command}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(
        f"- machine: `nproc` = {os.cpu_count()}, {platform.platform()}, load average {load:.1f}; "
        f"etcd {_etcd_version()}, one member, default raft timings, data on local disk"
    )
    print(
        f"- {args.ops} operations each, state of {args.state_bytes} bytes (sealed: base64 + HMAC)"
    )
    print()
    print("| backend, operation | p50 ms | p99 ms | max ms | ops |")
    print("|---|---|---|---|---|")
    for backend, ops in results.items():
        for name, values in ops.items():
            print(_row(f"{backend}, {name}", values))
    print()
    print("| leader TTL s | takeover after SIGKILL, s (median) | min-max | runs |")
    print("|---|---|---|---|")
    for ttl, values in takeovers.items():
        print(
            f"| {ttl} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} "
            f"| {len(values)} |"
        )


def _etcd_version() -> str:
    done = subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.split()[2] if done.returncode == 0 else "?"


if __name__ == "__main__":
    main()
