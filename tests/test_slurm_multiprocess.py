"""``sbatch`` + ``srun torchrelay run`` under a real Slurm (tests/slurm_cluster.py): no per-node
flags, the run directory named after the job, a killed rank rebuilt on a spare with nothing
lost, and the final weights bitwise equal to a failure-free run outside Slurm."""

from __future__ import annotations

import sys

import pytest

from tests.jobs import SCRIPTS, JobResult, assert_bitwise_equal
from tests.slurm_cluster import local_slurm, require_slurm

pytestmark = pytest.mark.slow
STEPS = 10

# The docs/slurm.md recipe, with this interpreter and the test script.
BATCH = """\
#!/bin/bash
#SBATCH --job-name=torchrelay-test
#SBATCH --nodes=1
#SBATCH --output={out}
set -euo pipefail
export TORCHRELAY_JOB_TOKEN=$({python} -c 'import secrets; print(secrets.token_hex(32))')
srun --ntasks-per-node=1 {python} -m torchrelay.cli.main run --nproc-per-node 3 --spares 1 \\
    --chaos kill:rank=1:step=4 {script} --steps {steps} --out runs/slurm-$SLURM_JOB_ID/final.pt
"""


@pytest.fixture
def slurm(tmp_path_factory):
    require_slurm()
    with local_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.mark.timeout(900)
def test_sbatch_job_recovers_a_killed_rank_bitwise(slurm, tmp_path, reference_weights):
    batch = tmp_path / "job.sh"
    out = tmp_path / "job.out"
    batch.write_text(
        BATCH.format(out=out, python=sys.executable, script=SCRIPTS / "mlp_train.py", steps=STEPS)
    )
    # --wait: sbatch returns when the job has ended, with the job's exit status.
    done = slurm.command(
        "sbatch", "--parsable", "--wait", f"--chdir={tmp_path}", str(batch), timeout=600
    )
    output = out.read_text() if out.exists() else "(no job output)"
    assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{output}\n{slurm.logs()}"
    job_id = int(done.stdout.strip().split(";")[0])

    # No --run-dir was given: every node agreed on runs/slurm-<jobid>.
    job = JobResult(done.returncode, output, tmp_path / "runs" / f"slurm-{job_id}")
    ledger = job.ledger()
    start = next(e for e in ledger if e["event"] == "job_start")
    assert (start["run_dir"], start["world_size"]) == (f"runs/slurm-{job_id}", 3)
    assert [e["event"] for e in ledger if e["event"] in ("failure", "recovery_done")] == [
        "failure",
        "recovery_done",
    ]
    summary = job.summary()
    assert summary["steps_committed"] == STEPS
    [failure] = summary["failures"]
    assert failure["cause"] == "SIGKILL" and failure["recovered"], failure
    assert failure["lost_steps"] == 0
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))
