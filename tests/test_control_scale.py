"""The control server holds 1,024+ Watch streams without a thread each (issue 9, item 13).

A correctness test with a generous safety timeout, no latency assertion: the latency target is
measured by ``python -m bench.control_plane`` (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import os
import threading

from bench.control_plane import drive
from torchrelay.config import JobConfig
from torchrelay.control.controller import Controller
from torchrelay.control.service import ControlServer
from torchrelay.control.wire import new_token
from torchrelay.ledger import Ledger, read_ledger

SPARES = 1024


def test_heartbeats_are_answered_and_finish_reaches_every_stream_of_1025(tmp_path):
    config = JobConfig(script="train.py", script_args=[], nproc_per_node=1, run_dir=tmp_path)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    controller = Controller(config, ledger, agent=None)  # type: ignore[arg-type]
    token = new_token()
    server = ControlServer(controller, token)
    server.start()
    seen: dict[str, int] = {}

    def all_open() -> None:
        seen["streams"] = server.open_streams
        seen["threads"] = len(os.listdir("/proc/self/task"))
        seen["python_threads"] = threading.active_count()

    try:
        load = asyncio.run(
            asyncio.wait_for(drive(server.address, token, SPARES, beats=3, on_open=all_open), 240)
        )
        controller.on_exit("worker0", 0)  # the job succeeds once its worker has exited cleanly
    finally:
        server.stop()
        ledger.close()
    # Every stream was open at once, on far fewer threads than streams (the old server had
    # one thread per stream out of 64, so stream 65 never opened).
    assert seen["streams"] == SPARES + 1
    assert seen["threads"] < 200, seen
    assert len(load.replies) == 3 * SPARES
    assert all(reply == {"hang_timeout": config.hang_floor} for reply in load.replies)
    assert len(load.streams) == SPARES + 1
    assert all(messages == [{"type": "finish"}] for messages in load.streams.values())
    end = read_ledger(tmp_path / "ledger.jsonl")[-1]
    assert end["event"] == "job_end" and end["status"] == "succeeded"
