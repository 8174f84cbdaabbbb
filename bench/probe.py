"""Raw gloo broadcast bandwidth between two processes: the yardstick for transfer efficiency.

``measure_broadcast(nbytes)`` starts two processes that broadcast one flat float32 tensor of
``nbytes`` from rank 0 to rank 1 (received into a tensor that already exists, as torchrelay
does), ``repeats`` times after a warm-up, and returns the median bytes/s seen by the receiver.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import ProcessSet, free_port, wait_exit


def _probe(rank: int, port: int, nbytes: int, repeats: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60)
    )
    group = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=60))
    tensor = torch.ones(nbytes // 4) if rank == 0 else torch.zeros(nbytes // 4)
    rates = []
    for i in range(repeats + 1):
        group.barrier().wait()
        start = time.perf_counter()
        group.broadcast([tensor], dist.BroadcastOptions()).wait()
        if i:  # the first round is a warm-up (connections, first touch)
            rates.append(nbytes / (time.perf_counter() - start))
    group.barrier().wait()
    if rank == 1:
        out.write_text(json.dumps({"bytes": nbytes, "bytes_per_s": statistics.median(rates)}))


def measure_broadcast(nbytes: int, repeats: int = 5, timeout_s: float = 60.0) -> float:
    """Median receiver-side bytes/s of a 2-process gloo broadcast of ``nbytes``."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, ProcessSet() as procs:
        out = Path(tmp) / "probe.json"
        deadline = time.monotonic() + timeout_s
        children = [
            procs.start(
                [
                    sys.executable,
                    "-m",
                    "bench.probe",
                    "--rank",
                    str(r),
                    "--port",
                    str(port),
                    "--bytes",
                    str(nbytes),
                    "--repeats",
                    str(repeats),
                    "--out",
                    str(out),
                ],
                Path(tmp) / f"probe{r}.log",
            )
            for r in (0, 1)
        ]
        for child in children:
            if wait_exit(child, deadline) != 0:
                raise RuntimeError((Path(tmp) / "probe1.log").read_text()[-2000:])
        return float(json.loads(out.read_text())["bytes_per_s"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    _probe(a.rank, a.port, a.bytes, a.repeats, a.out)
