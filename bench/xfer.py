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
does while the failure is detected and planned for). Then rank 0 and the spare measure the
floor in a 2-rank gloo group: a broadcast of one flat tensor of the same bytes into a tensor
that already exists (``bench/probe.py``'s yardstick), after a warm-up. All figures come from
the same processes, seconds apart, so their ratios are meaningful on a loaded machine.

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


def _worker(rank: int, world: int, port: int, mb: float, repeats: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from torchrelay.runtime.tracked import TrackedState
    from torchrelay.transfer.buffers import Prefault, publish_layout
    from torchrelay.transfer.engine import receive_state, send_state
    from torchrelay.transfer.sums import ChunkSums

    timeout = datetime.timedelta(seconds=300)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timeout)
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
    seconds: dict[str, list[float]] = {"baseline": [], "prepared": []}
    nbytes = 0
    # Alternate the two ways of receiving, so that both see the same load.
    for generation, mode in enumerate(["baseline", "prepared"] * repeats, start=1):
        prepared, ready = None, None
        if rank == spare:  # a fresh spare: an optimizer that has never stepped
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            tracked.objects["optimizer"] = opt
            if mode == "prepared":  # what the spare does while it waits for a plan
                prefault = Prefault(
                    f"127.0.0.1:{port}", TOKEN, {"objects": tracked.state()}, torch.device("cpu")
                )
                assert prefault.finished(timeout=300)
                prepared = prefault.take()
        own = tracked.state()
        if rank != spare and mode == "prepared":
            # What a survivor does from its halt to the transfer: about HALT_S in the ledger.
            ready = ChunkSums({"step": 1, "objects": own})
            ready.finished(timeout=HALT_S)
        pg.barrier().wait()
        start = time.perf_counter()
        if rank == spare:
            state = {"step": 0, "objects": own}
            result = receive_state(pg, store, TOKEN, generation, state, sources, prepared=prepared)
            tracked.load(result.state["objects"], own)
            seconds[mode].append(time.perf_counter() - start)
            nbytes = result.bytes
        else:
            state = {"step": 1, "objects": own}
            send_state(pg, store, TOKEN, generation, state, rank, sources, [spare], ready=ready)
        del own, prepared, ready
    pg.barrier().wait()
    floor = _floor(store, rank, spare, timeout, nbytes or _state_bytes(tracked))
    if rank == spare:
        result = {"bytes": nbytes, "broadcast_s": floor, "sources": len(sources)}
        out.write_text(json.dumps({**result, "transfer_s": seconds}))


def _state_bytes(tracked: Any) -> int:
    from torchrelay.transfer.flatten import flatten

    return sum(t.numel() * t.element_size() for t in flatten(tracked.state())[1])


def _floor(store: Any, rank: int, spare: int, timeout: Any, nbytes: int) -> list[float]:
    """Seconds of 2-rank gloo broadcasts of ``nbytes`` into an existing tensor (after one
    warm-up), between rank 0 and the spare; empty on other ranks."""
    import torch
    import torch.distributed as dist

    if rank not in (0, spare):
        return []
    pair = dist.ProcessGroupGloo(
        dist.PrefixStore("floor", store), 0 if rank == 0 else 1, 2, timeout
    )
    tensor = torch.ones(nbytes // 4) if rank == 0 else torch.zeros(nbytes // 4)
    times = []
    for i in range(4):
        pair.barrier().wait()
        start = time.perf_counter()
        pair.broadcast([tensor], dist.BroadcastOptions()).wait()
        if i:
            times.append(time.perf_counter() - start)
    pair.barrier().wait()
    return times


def measure(mb: float, sources: int = 1, repeats: int = 3, timeout_s: float = 600.0) -> dict:
    """One run: ``sources`` replicas send ~``mb`` MB of state to a fresh spare ``repeats``
    times, then the gloo floor; returns the spare's figures (see the module docstring)."""
    world, port = sources + 1, free_port()
    env = worker_env(MALLOC_MMAP_THRESHOLD_=str(128 * 1024))
    with tempfile.TemporaryDirectory() as tmp, ProcessSet() as procs:
        out = Path(tmp) / "xfer.json"
        deadline = time.monotonic() + timeout_s
        args = ["--world", str(world), "--port", str(port), "--mb", str(mb)]
        args += ["--repeats", str(repeats), "--out", str(out)]
        children = [
            procs.start(
                [sys.executable, "-m", "bench.xfer", "--rank", str(r), *args],
                Path(tmp) / f"xfer{r}.log",
                env=env,
            )
            for r in range(world)
        ]
        for r, child in enumerate(children):
            if wait_exit(child, deadline) != 0:
                raise RuntimeError((Path(tmp) / f"xfer{r}.log").read_text()[-3000:])
        result = json.loads(out.read_text())
    floor = statistics.median(result["broadcast_s"])
    result["broadcast_median_s"] = floor
    for mode, times in result["transfer_s"].items():
        result[f"{mode}_median_s"] = statistics.median(times)
        result[f"{mode}_efficiency"] = floor / statistics.median(times)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=float, default=15.0, help="state size, MB")
    parser.add_argument("--sources", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args()
    if a.rank is not None:
        _worker(a.rank, a.world, a.port, a.mb, a.repeats, a.out)
        return
    r = measure(a.mb, a.sources, a.repeats)
    print(
        f"{r['bytes'] / 1e6:.1f} MB from {r['sources']} source(s): gloo broadcast "
        f"{r['broadcast_median_s'] * 1e3:.1f} ms",
        flush=True,
    )
    for mode in r["transfer_s"]:
        times = ", ".join(f"{s * 1e3:.1f}" for s in r["transfer_s"][mode])
        print(
            f"  {mode}: transfer {r[f'{mode}_median_s'] * 1e3:.1f} ms ({times}), "
            f"efficiency {r[f'{mode}_efficiency']:.2f}"
        )


if __name__ == "__main__":
    main()
