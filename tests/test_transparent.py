"""The transparent mode's pure parts, in one process: the rewindable sampler cursor, the step
boundary's snapshot and its voiding, the open-ended step claims and the launch options."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler

from tests.jobs import cli
from torchrelay.cli import run_checks
from torchrelay.config import JobConfig
from torchrelay.control.claims import OPEN_ENDED, judge_claim
from torchrelay.runtime.timing import StepTimer
from torchrelay.transparent import sampler
from torchrelay.transparent.boundary import Boundary
from torchrelay.transparent.criu import CriuUnavailable
from torchrelay.transparent.hook import TransparentWorker
from torchrelay.transparent.launch import SITE_DIR, worker_environment


def _sampler(rank: int, size: int = 22, epoch: int = 3) -> DistributedSampler[int]:
    made = DistributedSampler(range(size), num_replicas=3, rank=rank, shuffle=True, seed=7)
    made.set_epoch(epoch)
    return made


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_cursor_yields_the_stock_order(rank: int) -> None:
    stock = list(sampler._STOCK_ITER(_sampler(rank)))
    assert list(sampler.SamplerCursor(_sampler(rank))) == stock


def test_rewind_goes_back_to_the_boundary_and_new_epochs_to_their_start() -> None:
    old = sampler.SamplerCursor(_sampler(0))
    order = old.indices(0)
    taken = [next(old) for _ in range(3)]
    boundary = sampler.positions()
    taken += [next(old), next(old)]
    fresh = sampler.SamplerCursor(_sampler(0, epoch=4))  # an epoch begun in the voided step
    next(fresh)
    sampler.rewind(boundary)
    assert next(old) == order[3] == taken[3]
    assert fresh.position == 0


def test_a_batch_sampler_gives_the_partial_last_batch_again() -> None:
    cursor = sampler.SamplerCursor(_sampler(1))  # 8 indices: batches of 3, 3, 2
    batches = iter(BatchSampler(cursor, 3, drop_last=False))
    order = cursor.indices(1)
    next(batches), next(batches)
    boundary = sampler.positions()
    assert next(batches) == order[6:]
    sampler.rewind(boundary)
    assert next(batches) == order[6:]
    with pytest.raises(StopIteration):
        next(batches)


def test_retarget_goes_on_with_the_other_slots_share() -> None:
    cursor = sampler.SamplerCursor(_sampler(0))
    next(cursor), next(cursor)
    sampler.retarget(2)
    assert next(cursor) == list(sampler._STOCK_ITER(_sampler(2)))[2]


def test_voiding_restores_rng_buffers_and_drops_gradients() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    boundary = Boundary.take([model])
    saved_buffers = [b.clone() for b in model.buffers()]

    def step() -> tuple[torch.Tensor, float, float]:
        drawn = torch.rand(3), np.random.rand(), random.random()
        model(torch.randn(5, 4)).sum().backward()
        return drawn

    first = step()
    assert not torch.equal(saved_buffers[0], next(model.buffers()))
    boundary.restore([optimizer])
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(saved_buffers, model.buffers(), strict=True))
    again = step()
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


def test_an_open_ended_job_is_done_where_its_script_stopped() -> None:
    assert judge_claim("done", 41, OPEN_ENDED, None) is None
    assert judge_claim("done", 41, 100, None) is not None


def test_a_finished_script_is_in_no_step_while_it_waits_for_the_jobs_end() -> None:
    """The last commit began a step the script never runs; once the script's training ends,
    no step is timed, or the controller would judge the rank stalled in it while the job's
    end waits (a handover that lost its race with the end, in a slow-suite run)."""
    timer = StepTimer()
    timer.start()  # what the last commit did (TransparentWorker._commit -> _begin)
    relay = SimpleNamespace(_current_step=7, timer=timer, _finish=lambda: True)
    worker = SimpleNamespace(_finished=False, relay=relay)
    TransparentWorker.finish(worker)  # type: ignore[arg-type]
    assert timer.step_age() is None and relay._current_step is None and worker._finished


def test_workers_get_the_site_directory_first_and_no_libuv() -> None:
    env = worker_environment({"PYTHONPATH": "/a:/b"})
    assert env["PYTHONPATH"].split(":") == [str(SITE_DIR), "/a", "/b"]
    assert env["USE_LIBUV"] == "0"
    assert (SITE_DIR / "sitecustomize.py").is_file()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--spares", "1"), "--spares 0"),
        (
            ("--spares", "0", "--checkpoint-dir", "/tmp/x", "--checkpoint-every", "5"),
            "--checkpoint-dir or --resume",
        ),
    ],
)
def test_options_it_cannot_honour_are_refused(flags: tuple[str, ...], expected: str) -> None:
    done = cli("run", "--transparent", "--nproc-per-node", "2", *flags, sys.executable)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert expected in done.stderr


def test_no_criu_is_refused_in_one_line(monkeypatch, capsys) -> None:
    # Which CRIU exists is find_criu's business (tests/test_transparent_snapshots.py); here:
    # that run refuses, in one line with exit status 2, when it finds none.
    def missing() -> None:
        raise CriuUnavailable("transparent mode needs CRIU >= 4.1 (no criu found): run setup")

    monkeypatch.setattr(run_checks, "find_criu", missing)
    config = JobConfig(script="train.py", script_args=[], nproc_per_node=2, run_dir=Path("r"))
    config.spares, config.transparent = 0, True
    with pytest.raises(SystemExit) as exited:
        run_checks.check_transparent(config, resume=False)
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "torchrelay run: transparent mode needs CRIU >= 4.1 (no criu found): run setup\n"
    )
