"""Shared helpers: real gloo groups between threads of the test process."""

from __future__ import annotations

import datetime
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist

from tests.etcd import etcd  # noqa: F401  (a fixture: a real etcd on free loopback ports)
from tests.live_job import live_job  # noqa: F401  (a fixture: a controller behind its RPC)
from torchrelay.runtime import native
from torchrelay.runtime.guard import NATIVE_SWITCH


def run_ranks(
    world: int, fn: Callable[[int, dist.ProcessGroup], Any], timeout: float = 20.0
) -> list[Any]:
    """Run ``fn(rank, group)`` in ``world`` threads, each with a real gloo group."""
    store = dist.PrefixStore(uuid.uuid4().hex, dist.HashStore())
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(store, rank, world, datetime.timedelta(seconds=timeout))
            results[rank] = fn(rank, pg)
        except BaseException as exc:  # surfaced in the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "rank thread did not finish"
    if errors:
        raise errors[0]
    return results


def require_built() -> None:
    """Skip where the runtime's C++ is not built (scripts/setup.sh builds it); CI must have it."""
    path = native.built_path()
    if path is None or not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"the runtime's C++ is not built ({path}): run scripts/setup.sh")
        pytest.skip("the runtime's C++ is not built here (scripts/setup.sh builds it)")


@pytest.fixture(params=["compiled", "python"])
def guard_kind(request, monkeypatch):
    """Which guard the processes a test starts run; they inherit the switch."""
    if request.param == "compiled":
        require_built()
    monkeypatch.setenv(NATIVE_SWITCH, "1" if request.param == "compiled" else "0")
    return request.param


@pytest.fixture
def ranks():
    return run_ranks


@pytest.fixture(scope="session")
def reference_weights(tmp_path_factory):
    """Final weights of failure-free runs of tests/scripts/mlp_train.py, by step count."""
    from tests.jobs import run_job

    cache: dict[int, dict] = {}

    def get(steps: int) -> dict:
        if steps not in cache:
            job = run_job(tmp_path_factory.mktemp(f"reference{steps}"), steps=steps, spares=0)
            assert job.returncode == 0, job.output
            assert job.summary()["failures"] == []
            cache[steps] = job.weights()
        return cache[steps]

    return get
