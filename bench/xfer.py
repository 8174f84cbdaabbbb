"""``python -m bench.xfer``: the transfer engine against the raw gloo floor, in one run.

Starts ``sources + 1`` processes on loopback. The sources hold a model of about ``--mb`` MB of
state (4 square ``Linear`` layers and their AdamW moments, after one step); the last rank is a
fresh spare (the same model, an AdamW that has never stepped, so its optimizer state must be
allocated). Each repeat the spare takes a new optimizer and receives the state with
:func:`torchrelay.transfer.engine.receive_state` (then ``TrackedState.load``), timed from a
barrier to the end of the load. Repeats alternate two modes: ``baseline`` (the spare receives
into memory it allocates then; each source hashes its stripe while it sends) and ``prepared``
(what the runtime does: the spare's buffers come from a :class:`Prefault` that finished while it
waited; each source hashed its chunks for up to ``HALT_S`` before the transfer, as a survivor
does while the failure is detected and planned for). With ``--laggard``, a third mode:
``laggard``, a receiver that holds the whole state one step behind and receives beside it
(``keep_own``, as the runtime does where a copy fits, see :mod:`torchrelay.transfer.buffers`),
all of it into memory it allocates then. Each round ends with the floor: rank 0
and the spare, in a 2-rank gloo group, broadcast one flat tensor of the same bytes into a tensor
that already exists (``bench/probe.py``'s yardstick; warmed up once). Efficiency is floor /
transfer within each round (median and range over rounds): the three figures of a round are
taken a fraction of a second apart, so their ratio is meaningful on a loaded machine.

Every large allocation is a fresh ``mmap`` (``MALLOC_MMAP_THRESHOLD_``), as in a spare that has
never held this state: without it, a repeat would reuse the previous repeat's pages.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.hostlinks import NIC, HostLinks
from bench.procs import ProcessSet, free_port, wait_exit, worker_env

# Detection + plan + communicator in the ledger of a small-model recovery (docs/benchmarks.md):
# the time a survivor has to hash its chunks before it sends.
HALT_S = 0.020
TOKEN = "bench-xfer-token"  # a benchmark's own job token; nothing here is reachable off-host


def _model(mb: float) -> Any:
    import torch

    # 4 square layers: params = 4 (h^2 + h); state = params * 12 B (weights, m, v).
    hidden = max(8, int(math.sqrt(mb * 1e6 / 12 / 4)))
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(hidden, hidden) for _ in range(4)))


MODES = ("baseline", "prepared")
LAGGARD = "laggard"


def _worker(
    rank: int,
    world: int,
    host: str,
    port: int,
    mb: float,
    repeats: int,
    out: Path,
    modes: tuple[str, ...],
) -> None:
    import torch
    import torch.distributed as dist

    from torchrelay.runtime.tracked import TrackedState
    from torchrelay.transfer.buffers import Prefault, publish_layout
    from torchrelay.transfer.engine import receive_state, send_state
    from torchrelay.transfer.sums import ChunkSums

    timeout = datetime.timedelta(seconds=300)
    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout)
    pg = dist.ProcessGroupGloo(store, rank, world, timeout)
    spare, sources = world - 1, list(range(world - 1))
    model = _model(mb)
    tracked = TrackedState()
    tracked.add("model", model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracked.add("optimizer", opt)
    if rank != spare:
        model(torch.ones(2, model[0].in_features)).sum().backward()
        opt.step()
    if rank == 0:  # as rank 0 does at its first committed step
        publish_layout(store, TOKEN, {"step": 1, "objects": tracked.state()})
    pair = _pair(store, rank, spare, timeout)
    floor_buffer: Any = None
    seconds: dict[str, list[float]] = {mode: [] for mode in (*modes, "broadcast")}
    generation = 0
    # Each round: the ways of receiving, then the floor, so that all of them see one load.
    for _round in range(repeats):
        for mode in modes:
            generation += 1
            prepared, ready = None, None
            if rank == spare:  # a fresh spare: an optimizer that has never stepped
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                tracked.objects["optimizer"] = opt
                if mode == "prepared":  # what the spare does while it waits for a plan
                    own = {"objects": tracked.state()}
                    prefault = Prefault(f"{host}:{port}", TOKEN, own, torch.device("cpu"))
                    assert prefault.finished(timeout=300)
                    prepared = prefault.take()
                if mode == LAGGARD:  # it holds a stepped optimizer's state: a whole replica
                    model(torch.ones(2, model[0].in_features)).sum().backward()
                    opt.step()
            own = tracked.state()
            if rank != spare and mode == "prepared":
                # What a survivor does from its halt to the transfer: about HALT_S (ledger).
                ready = ChunkSums({"step": 1, "objects": own})
                ready.finished(timeout=HALT_S)
            pg.barrier().wait()
            start = time.perf_counter()
            if rank == spare:
                state = {"step": 0, "objects": own}
                result = receive_state(
                    pg,
                    store,
                    TOKEN,
                    generation,
                    state,
                    sources,
                    prepared=prepared,
                    keep_own=mode == LAGGARD,
                )
                tracked.load(result.state["objects"], own)
                seconds[mode].append(time.perf_counter() - start)
                nbytes = result.bytes
            else:
                state = {"step": 1, "objects": own}
                send_state(pg, store, TOKEN, generation, state, rank, sources, [spare], ready=ready)
                nbytes = _state_bytes(tracked)
            del own, prepared, ready
        if pair is not None:
            if floor_buffer is None:  # mapped, and the connection warmed up, before timing
                floor_buffer = torch.empty(nbytes // 4).fill_(float(rank == 0))
                pair.broadcast([floor_buffer], dist.BroadcastOptions()).wait()
            pair.barrier().wait()
            start = time.perf_counter()
            pair.broadcast([floor_buffer], dist.BroadcastOptions()).wait()
            seconds["broadcast"].append(time.perf_counter() - start)
        pg.barrier().wait()
    if rank == spare:
        result = {"bytes": nbytes, "sources": len(sources)}
        out.write_text(json.dumps({**result, "seconds": seconds}))


def _state_bytes(tracked: Any) -> int:
    from torchrelay.transfer.flatten import flatten

    return sum(t.numel() * t.element_size() for t in flatten(tracked.state())[1])


def _pair(store: Any, rank: int, spare: int, timeout: Any) -> Any:
    """The 2-rank gloo group of rank 0 and the spare that measures the floor (None elsewhere)."""
    import torch.distributed as dist

    if rank not in (0, spare):
        return None
    return dist.ProcessGroupGloo(dist.PrefixStore("floor", store), int(rank != 0), 2, timeout)


def measure(
    mb: float,
    sources: int = 1,
    repeats: int = 3,
    timeout_s: float = 600.0,
    links: HostLinks | None = None,
    laggard: bool = False,
) -> dict:
    """One run: ``sources`` replicas send ~``mb`` MB of state to a fresh spare ``repeats``
    rounds; returns the spare's figures (see the module docstring).

    With ``links``, source ``k`` runs on ``links``' emulated host ``k`` (its own capped link,
    :mod:`bench.hostlinks`) and the spare on the receiver's side; else all run on loopback.
    ``laggard`` adds the mode of that name.
    """
    modes = (*MODES, LAGGARD) if laggard else MODES
    world, port = sources + 1, free_port()
    env = worker_env(MALLOC_MMAP_THRESHOLD_=str(128 * 1024))
    host = "127.0.0.1" if links is None else links.address(0)
    with tempfile.TemporaryDirectory() as tmp, ProcessSet() as procs:
        out = Path(tmp) / "xfer.json"
        deadline = time.monotonic() + timeout_s
        args = ["--world", str(world), "--host", host, "--port", str(port), "--mb", str(mb)]
        args += ["--repeats", str(repeats), "--out", str(out), "--modes", ",".join(modes)]
        command = [sys.executable, "-m", "bench.xfer", *args]
        children = [
            procs.start(
                [*_on_host(links, r, world), *command, "--rank", str(r)],
                Path(tmp) / f"xfer{r}.log",
                env=env if links is None else {**env, "GLOO_SOCKET_IFNAME": _nic(links, r, world)},
            )
            for r in range(world)
        ]
        for r, child in enumerate(children):
            if wait_exit(child, deadline) != 0:
                raise RuntimeError((Path(tmp) / f"xfer{r}.log").read_text()[-3000:])
        result = json.loads(out.read_text())
    floor = result["seconds"]["broadcast"]
    result["broadcast_median_s"] = statistics.median(floor)
    result["modes"] = list(modes)
    for mode in modes:
        times = result["seconds"][mode]
        ratios = sorted(f / t for f, t in zip(floor, times, strict=True))  # per round
        result[mode] = {
            "median_s": statistics.median(times),
            "efficiency": statistics.median(ratios),
            "efficiency_range": [ratios[0], ratios[-1]],
        }
    return result


def _on_host(links: HostLinks | None, rank: int, world: int) -> list[str]:
    """The prefix that runs ``rank`` on its emulated host (sources only; the spare stays)."""
    return [] if links is None or rank == world - 1 else links.prefix(rank)


def _nic(links: HostLinks, rank: int, world: int) -> str:
    return links.bridge if rank == world - 1 else NIC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=float, default=15.0, help="state size, MB")
    parser.add_argument("--sources", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=argparse.SUPPRESS)
    parser.add_argument(
        "--laggard", action="store_true", help="also time a laggard's receive beside its state"
    )
    a = parser.parse_args()
    if a.rank is not None:
        modes = tuple(a.modes.split(","))
        _worker(a.rank, a.world, a.host, a.port, a.mb, a.repeats, a.out, modes)
        return
    r = measure(a.mb, a.sources, a.repeats, laggard=a.laggard)
    floor = ", ".join(f"{x * 1e3:.1f}" for x in r["seconds"]["broadcast"])
    print(f"{r['bytes'] / 1e6:.1f} MB from {r['sources']} source(s): gloo broadcast ms {floor}")
    for mode in r["modes"]:
        times = ", ".join(f"{x * 1e3:.1f}" for x in r["seconds"][mode])
        low, high = r[mode]["efficiency_range"]
        print(
            f"  {mode}: transfer ms {times}; efficiency {r[mode]['efficiency']:.2f} "
            f"({low:.2f}-{high:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
