"""``python -m bench.control_plane``: heartbeat latency with 1,024 open Watch streams.

The control server runs in a child process, as the launcher hosts it in a job; this process
plays one worker and ``--spares`` spares over grpc.aio, as real processes do: each joins, opens
its Watch stream, and once the server has acknowledged every stream, each spare sends a
heartbeat (a ``progress`` report) every 0.5 s for ``--beats`` rounds. Then the worker reports
``done`` and every stream must end with its ``finish`` message. Printed: heartbeat latency
p50/p99/max (target p99 < 100 ms) and the server process's thread count before and while the
streams are open. :func:`drive` is also what ``tests/test_control_scale.py`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from torchrelay.control.client import SERVICE
from torchrelay.control.wire import seal, unseal

HEARTBEAT_INTERVAL = 0.5


@dataclass
class Load:
    """What the simulated processes saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, one per heartbeat
    replies: list[dict[str, Any]] = field(default_factory=list)  # one per heartbeat
    streams: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # messages received


async def drive(
    address: str,
    token: str,
    spares: int,
    beats: int,
    channels: int = 16,
    on_open: Callable[[], None] | None = None,
    seed: int = 0,
) -> Load:
    """Join ``worker0`` (slot 0 of a world of 1) and ``spares`` spares, hold a Watch stream for
    each, heartbeat ``beats`` times from every spare, then finish the job from the worker.

    ``on_open`` is called once every stream is open on the server. Raises ``grpc.RpcError`` if
    any call is refused or the server does not answer.
    """
    options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    pool = [grpc.aio.insecure_channel(address, options=options) for _ in range(channels)]
    processes = ["worker0"] + [f"spare{i}" for i in range(spares)]
    load = Load()
    try:

        async def call(index: int, method: str, body: dict[str, Any]) -> dict[str, Any]:
            stub = pool[index % channels].unary_unary(f"/{SERVICE}/{method}")
            reply = await stub(seal(body, token), timeout=60, wait_for_ready=True)
            return unseal(reply, token)

        await asyncio.gather(
            *(
                call(
                    i,
                    "Join",
                    {
                        "process": p,
                        "role": "spare" if i else "worker",
                        "pid": i,
                        "node": "node0",
                        "slot": None if i else 0,
                    },
                )
                for i, p in enumerate(processes)
            )
        )
        streams = [
            pool[i % channels].unary_stream(f"/{SERVICE}/Watch")(
                seal({"process": p}, token), wait_for_ready=True
            )
            for i, p in enumerate(processes)
        ]
        await asyncio.gather(*(stream.initial_metadata() for stream in streams))
        if on_open is not None:
            on_open()

        async def collect(stream: Any) -> list[dict[str, Any]]:
            return [unseal(raw, token) async for raw in stream]

        received = [asyncio.ensure_future(collect(stream)) for stream in streams]
        rng = random.Random(seed)

        async def heartbeats(index: int, offset: float) -> None:
            await asyncio.sleep(offset)  # spread like processes started at different times
            for _ in range(beats):
                sent = time.perf_counter()
                body = {
                    "process": processes[index],
                    "kind": "progress",
                    "generation": 0,
                    "step": -1,
                }
                load.replies.append(await call(index, "Report", body))
                took = time.perf_counter() - sent
                load.latencies.append(took)
                await asyncio.sleep(max(0.0, HEARTBEAT_INTERVAL - took))

        await asyncio.gather(
            *(heartbeats(i, rng.uniform(0, HEARTBEAT_INTERVAL)) for i in range(1, len(processes)))
        )
        # A world of one step: the worker declares it, then reports it done.
        declare = {"process": "worker0", "kind": "max_steps", "generation": 0, "max_steps": 1}
        await call(0, "Report", declare)
        await call(0, "Report", {"process": "worker0", "kind": "done", "generation": 0, "step": 0})
        for process, messages in zip(processes, await asyncio.gather(*received), strict=True):
            load.streams[process] = messages
        return load
    finally:
        await asyncio.gather(*(channel.close() for channel in pool))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def serve(run_dir: Path) -> None:
    """The child: a controller for a world of 1 and its server; prints where it listens."""
    from torchrelay.config import JobConfig
    from torchrelay.control.controller import Controller
    from torchrelay.control.service import ControlServer
    from torchrelay.control.wire import new_token
    from torchrelay.ledger import Ledger

    config = JobConfig(script="bench", script_args=[], nproc_per_node=1, run_dir=run_dir)
    ledger = Ledger(run_dir / "ledger.jsonl")
    controller = Controller(config, ledger, agent=None)  # type: ignore[arg-type]
    token = new_token()
    server = ControlServer(controller, token)
    server.start()
    print(json.dumps({"address": server.address, "token": token}), flush=True)
    controller.wait_finished()
    server.stop()
    ledger.close()


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.control_plane", description=__doc__)
    parser.add_argument("--spares", type=int, default=1024)
    parser.add_argument("--beats", type=int, default=20, help="heartbeats per spare")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    with tempfile.TemporaryDirectory() as run_dir:
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.control_plane", "--serve", run_dir],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            endpoint = json.loads(child.stdout.readline())
            idle = threads_of(child.pid)
            loaded: list[int] = []
            started = time.perf_counter()
            load = asyncio.run(
                drive(
                    endpoint["address"],
                    endpoint["token"],
                    args.spares,
                    args.beats,
                    on_open=lambda: loaded.append(threads_of(child.pid)),
                )
            )
            wall = time.perf_counter() - started
            child.wait(timeout=60)
        finally:
            child.kill()
    finished = sum(1 for m in load.streams.values() if m and m[-1]["type"] == "finish")
    ms = [1000 * s for s in load.latencies]
    print(f"open Watch streams: {len(load.streams)} (worker0 + {args.spares} spares)")
    print(f"heartbeats: {len(ms)} answered, every {HEARTBEAT_INTERVAL} s from each spare")
    print(
        f"heartbeat latency: p50 {statistics.median(ms):.1f} ms, p99 {percentile(ms, 0.99):.1f} "
        f"ms, max {max(ms):.1f} ms (target p99 < 100 ms)"
    )
    print(f"server threads: {idle} before the streams, {loaded[0]} with all streams open")
    print(f"streams ended with finish: {finished}/{len(load.streams)}")
    print(
        f"CPU over {wall:.1f} s: server {cpu_seconds(resource.RUSAGE_CHILDREN):.1f} s, "
        f"clients {cpu_seconds(resource.RUSAGE_SELF):.1f} s ({os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
