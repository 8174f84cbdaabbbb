"""``sbatch`` + ``srun torchrelay run`` under a real Slurm of two nodes on this machine
(tests/slurm_cluster.py): no per-node flags, one run directory named after the job, a killed
rank rebuilt on a spare with nothing lost, and the final weights bitwise equal to a
failure-free run outside Slurm."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.jobs import SCRIPTS, JobResult, assert_bitwise_equal, run_job
from tests.slurm_cluster import SlurmCluster, local_slurm, require_slurm
from torchrelay.agent.slurm import default_port

pytestmark = pytest.mark.slow
STEPS = 10

# The docs/slurm.md recipe, with this interpreter and the test script.
BATCH = """\
#!/bin/bash
#SBATCH --job-name=torchrelay-test
#SBATCH --nodes={nodes}
#SBATCH --output={out}
set -euo pipefail
export TORCHRELAY_JOB_TOKEN=$({python} -c 'import secrets; print(secrets.token_hex(32))')
srun --ntasks-per-node=1 {python} -m torchrelay.cli.main run --nproc-per-node {nproc} \\
    --spares 1 --chaos {chaos} {script} --steps {steps} --out runs/slurm-$SLURM_JOB_ID/final.pt
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    require_slurm()
    with local_slurm(tmp_path_factory.mktemp("slurm"), nodes=2) as cluster:
        yield cluster


def sbatch(slurm: SlurmCluster, where: Path, nodes: int, nproc: int, chaos: str) -> JobResult:
    """Submit the recipe from ``where`` and wait for the job's end; its run directory is
    ``where/runs/slurm-<jobid>``, as no --run-dir is given."""
    batch, out = where / "job.sh", where / "job.out"
    script = SCRIPTS / "mlp_train.py"
    batch.write_text(
        BATCH.format(
            nodes=nodes,
            out=out,
            python=sys.executable,
            nproc=nproc,
            chaos=chaos,
            script=script,
            steps=STEPS,
        )
    )
    # --wait: sbatch returns when the job has ended, with the job's exit status.
    done = slurm.command(
        "sbatch", "--parsable", "--wait", f"--chdir={where}", str(batch), timeout=600
    )
    output = out.read_text() if out.exists() else "(no job output)"
    assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{output}\n{slurm.logs()}"
    job_id = int(done.stdout.strip().split(";")[0])
    return JobResult(done.returncode, output, where / "runs" / f"slurm-{job_id}")


def assert_recovered_once(job: JobResult, world_size: int, rank: int) -> None:
    """Every node agreed on the run directory; one kill, recovered with nothing lost."""
    ledger = job.ledger()
    start = next(e for e in ledger if e["event"] == "job_start")
    assert start["run_dir"] == f"runs/{job.run_dir.name}"
    assert start["world_size"] == world_size
    recovery = [e["event"] for e in ledger if e["event"] in ("failure", "recovery_done")]
    assert recovery == ["failure", "recovery_done"], recovery
    summary = job.summary()
    assert summary["steps_committed"] == STEPS
    [failure] = summary["failures"]
    assert (failure["rank"], failure["cause"], failure["recovered"]) == (rank, "SIGKILL", True)
    assert failure["lost_steps"] == 0


@pytest.mark.timeout(900)
def test_one_node_sbatch_job_recovers_a_killed_rank_bitwise(slurm, tmp_path, reference_weights):
    job = sbatch(slurm, tmp_path, nodes=1, nproc=3, chaos="kill:rank=1:step=4")
    assert_recovered_once(job, world_size=3, rank=1)
    assert_bitwise_equal(job.weights(), reference_weights(STEPS))


@pytest.mark.timeout(900)
def test_two_node_sbatch_job_meets_on_the_first_host_and_recovers(slurm, tmp_path_factory):
    # Nodes 127.0.0.1 and 127.0.0.2: node 1 finds the store and the controller on the first
    # host of SLURM_STEP_NODELIST (127.0.0.[1-2]), at the port derived from the job id.
    job = sbatch(
        slurm, tmp_path_factory.mktemp("job"), nodes=2, nproc=2, chaos="kill:rank=3:step=4"
    )
    assert_recovered_once(job, world_size=4, rank=3)
    assert [e["node"] for e in job.ledger() if e["event"] == "node_join"] == ["node1"]
    job_id = int(job.run_dir.name.removeprefix("slurm-"))
    # The controller listens next to the store: on 127.0.0.1, at the derived port + 1.
    assert (job.run_dir / "endpoint").read_text() == f"127.0.0.1:{default_port(job_id) + 1}"
    reference = run_job(tmp_path_factory.mktemp("reference"), nproc=4, spares=0, steps=STEPS)
    assert reference.returncode == 0, reference.output
    assert_bitwise_equal(job.weights(), reference.weights())


def test_several_tasks_per_node_are_refused_in_one_line(slurm, tmp_path):
    done = slurm.command(
        "srun",
        f"--chdir={tmp_path}",
        "--nodes=1",
        "--ntasks-per-node=2",
        sys.executable,
        "-m",
        "torchrelay.cli.main",
        "run",
        str(SCRIPTS / "mlp_train.py"),
        timeout=300,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    refusals = [line for line in done.stderr.splitlines() if line.startswith("torchrelay run:")]
    assert len(refusals) == 2, done.stderr  # one from each task
    assert all("Slurm started 2 tasks on a node" in line for line in refusals)
    assert "srun --ntasks-per-node=1" in refusals[0]
    assert not (tmp_path / "runs").exists()
