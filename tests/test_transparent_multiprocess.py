"""``torchrelay run --transparent`` on an ordinary torchrun script (tests/scripts/plain_trainer.py,
not written for torchrelay): real jobs, compared bit for bit with the same script under torchrun.

The failure is a communicator that silently stops delivering in the middle of a step (``drop``
chaos): every rank is blocked in the step's gradient all-reduce, the controller aborts the
generation, each rank voids the step (its optimizer, scheduler, RNG, sampler position), the
communicator is rebuilt, and the script's own loop runs the same batch again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.etcd import free_port
from tests.jobs import SCRIPTS, JobResult, assert_bitwise_equal
from tests.snapshots import require_criu

SCRIPT = str(SCRIPTS / "plain_trainer.py")
# 96 samples, 2 ranks, batches of 4: 12 steps per epoch, 3 epochs.
STEPS, PER_EPOCH = 36, 12

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def torchrun_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("torchrun") / "final.pt"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        SCRIPT,
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return torch.load(out, weights_only=True)


def transparent_job(run_dir: Path, *chaos: str) -> JobResult:
    require_criu()  # --transparent refuses to start without it
    command = [
        sys.executable,
        "-m",
        "torchrelay.cli.main",
        "run",
        "--transparent",
        "--nproc-per-node",
        "2",
        "--spares",
        "0",
        "--run-dir",
        str(run_dir),
        *(f"--chaos={spec}" for spec in chaos),
        SCRIPT,
        "--snapshot",
        str(run_dir / "snapshot.pt"),
        "--out",
        str(run_dir / "final.pt"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return JobResult(done.returncode, done.stdout + done.stderr, run_dir)


def test_unmodified_script_runs_as_under_torchrun(tmp_path, torchrun_weights) -> None:
    job = transparent_job(tmp_path / "run")
    assert job.returncode == 0, job.output
    assert job.summary()["steps_committed"] == STEPS
    assert (tmp_path / "run" / "snapshot.pt").is_file()  # the script's own snapshot file
    assert_bitwise_equal(job.weights(), torchrun_weights, job)


@pytest.mark.parametrize("step", [PER_EPOCH + 5, PER_EPOCH], ids=["mid-epoch", "epoch-start"])
def test_a_step_cut_in_its_all_reduce_is_voided_and_redone(tmp_path, torchrun_weights, step):
    job = transparent_job(tmp_path / "run", f"drop:rank=1:step={step}")
    assert job.returncode == 0, job.output
    assert f"step {step} voided" in job.output
    summary = job.summary()
    assert summary["steps_committed"] == STEPS
    assert [f["lost_steps"] for f in summary["failures"]] == [0]
    assert_bitwise_equal(job.weights(), torchrun_weights, job)
