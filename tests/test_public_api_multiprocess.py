"""The public API where ported scripts meet it, with real jobs (tests/scripts/ported_train.py):
plain torch.distributed on the default group, rank-local state, epochs and a script's own
snapshot, each through a SIGKILL and a spare, bitwise equal to the failure-free run."""

from __future__ import annotations

import json

import pytest

from tests.jobs import JobResult, assert_bitwise_equal, run_job

pytestmark = pytest.mark.slow
SCRIPT = "ported_train.py"
STEPS = 10
WORLD = 3


def _per_rank(job: JobResult) -> list[dict]:
    return [json.loads((job.run_dir / f"final.pt.rank{r}.json").read_text()) for r in range(WORLD)]


def _logs(job: JobResult) -> dict[str, str]:
    return {p.stem: p.read_text() for p in (job.run_dir / "logs").glob("*.log")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> JobResult:
    """The failure-free run; it also tracks a per-rank counter as replicated (a misuse)."""
    job = run_job(
        tmp_path_factory.mktemp("reference"),
        script=SCRIPT,
        spares=0,
        steps=STEPS,
        script_args=("--replicated-counter",),
    )
    assert job.returncode == 0, job.output
    return job


def test_replicated_state_that_differs_across_ranks_is_reported(reference):
    warnings = [e for e in reference.ledger() if e["event"] == "warning"]
    assert [w["objects"] for w in warnings] == [["per_rank_loss"]], warnings
    assert warnings[0]["what"] == "replicated_state_differs" and warnings[0]["step"] == 0
    assert "relay.track(local=...)" in _logs(reference)["worker0"]
    # Epochs as the DistributedSampler's loader defines them: 96 samples / 3 ranks / 8.
    steps = _per_rank(reference)[0]["epochs"]
    assert steps == [[s, s // 4, 4] for s in range(STEPS)]


def test_ported_script_survives_a_kill_bitwise_and_keeps_rank_local_state(tmp_path, reference):
    """DistributedSampler(dataset), dist.get_rank(), all_reduce on the default group,
    destroy_process_group; rank 2 (a spare built its sampler as rank 0) dies mid-epoch."""
    job = run_job(tmp_path, script=SCRIPT, spares=1, steps=STEPS, chaos=("kill:rank=2:step=5",))
    assert job.returncode == 0, job.output
    assert_bitwise_equal(job.weights(), reference.weights())
    summary = job.summary()
    assert summary["zero_loss_recoveries"] == 1 and summary["steps_committed"] == STEPS
    ours, ref = _per_rank(job), _per_rank(reference)
    # Each slot's own loss sum, the replacement's included, bit for bit.
    assert [r["stats"] for r in ours] == [r["stats"] for r in ref]
    assert len({r["stats"]["loss_sum"] for r in ref}) == WORLD  # truly rank-local
    first = ours[2]["epochs"][0][0]  # the replacement starts at the step killed (or next)
    assert first in (5, 6) and ours[2]["epochs"] == ref[2]["epochs"][first:]
    assert not [e for e in job.ledger() if e["event"] == "warning"]


def test_a_loader_with_workers_that_augments_survives_a_kill_bitwise(tmp_path):
    """DataLoader(num_workers=2) over a dataset that draws random noise per sample: the
    replacement starts its loader mid-epoch, each batch augmented as it was; the survivors keep
    theirs (they redo the step in flight with the batch they had)."""
    workers = ("--loader-workers", "2")
    ref = run_job(tmp_path / "ref", script=SCRIPT, spares=0, steps=STEPS, script_args=workers)
    assert ref.returncode == 0, ref.output
    chaos = ("kill:rank=1:step=5",)
    job = run_job(
        tmp_path / "kill", script=SCRIPT, spares=1, steps=STEPS, script_args=workers, chaos=chaos
    )
    assert job.returncode == 0, job.output
    assert job.summary()["zero_loss_recoveries"] == 1
    assert_bitwise_equal(job.weights(), ref.weights(), job)
    # Loader workers started per rank: one loader per epoch of 2 workers, 3 epochs; the
    # replacement's loader of its first epoch comes on top of the killed rank's.
    started = [_loader_workers(j) for j in (ref, job)]
    assert started == [{0: 6, 1: 6, 2: 6}, {0: 6, 1: 8, 2: 6}]


def _loader_workers(job: JobResult) -> dict[int, int]:
    ranks = (job.run_dir / "final.pt.loader_workers").read_text().split()
    return {r: ranks.count(str(r)) for r in range(WORLD)}


def test_a_script_resuming_from_its_own_snapshot_starts_there_and_spares_do_not_load_it(
    tmp_path, reference
):
    snapshot = str(tmp_path / "snapshot.pt")
    first = run_job(
        tmp_path / "first", script=SCRIPT, spares=0, steps=6, script_args=("--snapshot", snapshot)
    )
    assert first.returncode == 0, first.output
    job = run_job(
        tmp_path / "resumed",
        script=SCRIPT,
        spares=1,
        steps=STEPS,
        chaos=("kill:rank=1:step=8",),
        script_args=("--snapshot", snapshot),
    )
    assert job.returncode == 0, job.output
    assert_bitwise_equal(job.weights(), reference.weights())
    summary = job.summary()
    assert summary["steps_committed"] == STEPS and summary["zero_loss_recoveries"] == 1
    logs = _logs(job)
    resumed = [name for name, text in logs.items() if "Resuming training from snapshot" in text]
    assert sorted(resumed) == ["worker0", "worker1", "worker2"], logs.keys()
    run = [s for s, _, _ in _per_rank(job)[0]["epochs"]]  # step 8 twice: dropped, redone
    assert run[0] == 6 and sorted(set(run)) == list(range(6, STEPS))


def test_rank_local_state_is_in_the_durable_checkpoint_per_rank(tmp_path, reference):
    """A job that ended after 6 steps (a checkpoint after step 4) is resumed for 10: each
    rank's own loss sum comes back from its own part of the checkpoint, bit for bit."""
    flags = ("--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "5")
    misuse = ("--replicated-counter",)  # tracked as in the reference: same fingerprint
    first = run_job(tmp_path, script=SCRIPT, steps=6, launcher_args=flags, script_args=misuse)
    assert first.returncode == 0, first.output
    job = run_job(
        tmp_path,
        script=SCRIPT,
        steps=STEPS,
        launcher_args=(*flags, "--resume"),
        script_args=misuse,
    )
    assert job.returncode == 0, job.output
    assert_bitwise_equal(job.weights(), reference.weights())
    ours, ref = _per_rank(job), _per_rank(reference)
    assert [r["stats"] for r in ours] == [r["stats"] for r in ref]
    assert all(r["epochs"] == ref[0]["epochs"][5:] for r in ours)  # it went on at step 5
    (resumed,) = [e for e in job.ledger() if e["event"] == "resumed"]
    assert resumed["from_step"] == 4 and resumed["steps_replayed"] == 1
