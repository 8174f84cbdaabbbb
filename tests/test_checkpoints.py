"""Durable checkpoints without processes: --checkpoint-every, the manifest and its
verification, the choice of the checkpoint to resume from, atomic publication, and one rank's
writer and loader (world size 1, no process group: the writer uses none)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.jobs import cli
from torchrelay import checkpoints as layout
from torchrelay.agent.resume import (
    Recorder,
    choose_for_resume,
    hold,
    last_committed,
    reclaim_run_dir,
    resumed_event,
)
from torchrelay.agent.rundir import RunDirError
from torchrelay.config import JobConfig
from torchrelay.events import CheckpointSaved, JobEnd, Progress, read_events
from torchrelay.ledger import Ledger
from torchrelay.runtime.checkpoint import Checkpointer, load
from torchrelay.runtime.replicas import LocalMirror
from torchrelay.runtime.tracked import TrackedState

# A rank writes its own part, deliberately without a process group (no_dist).
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is:UserWarning")


@pytest.fixture(autouse=True)
def job_key(monkeypatch):
    """The key the launcher would hand its processes (manifests are signed with it)."""
    monkeypatch.setenv(layout.KEY_ENV, "0" * 64)


# ------------------------------------------------------------------ --checkpoint-every
@pytest.mark.parametrize(
    ("text", "every"),
    [
        ("5", layout.Every(steps=5)),
        ("90s", layout.Every(seconds=90)),
        ("2m", layout.Every(seconds=120)),
    ],
)
def test_checkpoint_every_parses_steps_seconds_and_minutes(text, every):
    assert layout.parse_every(text) == every
    assert layout.parse_every(str(every)) == every  # what the workers receive


@pytest.mark.parametrize("text", ["0", "-3", "5h", "1.5m", "", "m", "ten"])
def test_bad_checkpoint_every_is_one_line(text):
    with pytest.raises(layout.CheckpointError, match="--checkpoint-every must be N"):
        layout.parse_every(text)


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--checkpoint-dir", "x", "--checkpoint-every", "5h"], "--checkpoint-every must be N"),
        (["--checkpoint-dir", "x"], "--checkpoint-dir and --checkpoint-every go together"),
        (["--checkpoint-every", "5"], "--checkpoint-dir and --checkpoint-every go together"),
        (["--resume", "--checkpoint-dir", "x", "--checkpoint-every", "5"], "--resume needs"),
    ],
)
def test_run_refuses_bad_checkpoint_flags_in_one_line(tmp_path, flags, error):
    script = tmp_path / "train.py"
    script.write_text("")
    done = cli("run", *flags, str(script))
    assert done.returncode != 0
    assert error in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_resume_without_a_checkpoint_is_refused_and_touches_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    run_dir = tmp_path / "run"
    flags = ["--run-dir", str(run_dir), "--checkpoint-dir", str(tmp_path / "ck")]
    done = cli("run", *flags, "--checkpoint-every", "5", "--resume", str(script))
    assert done.returncode != 0 and "no complete checkpoint in" in done.stderr
    assert not run_dir.exists()


# ------------------------------------------------------------------ manifest, verify, choose
def fake_checkpoint(root: Path, step: int, world_size: int = 2) -> Path:
    """A committed checkpoint of made-up files, published like the writer does."""
    tmp = layout.tmp_dir(root, step)
    part = layout.part(tmp, 0)
    part.mkdir(parents=True)
    (part / "data.distcp").write_bytes(os.urandom(1000))
    (part / "tree.json").write_text("{}")
    manifest = layout.Manifest(step, world_size, {"model": []}, layout.describe_files(tmp))
    layout.write_manifest(tmp, manifest)
    layout.publish(tmp, layout.step_dir(root, step))
    return layout.step_dir(root, step)


def test_a_published_checkpoint_verifies(tmp_path):
    directory = fake_checkpoint(tmp_path, 9)
    manifest = layout.verify(directory)
    assert (manifest.step, manifest.world_size) == (9, 2)
    assert set(manifest.files) == {"part-0/data.distcp", "part-0/tree.json"}
    assert not layout.tmp_dir(tmp_path, 9).exists()


def _resign(directory: Path, key: str, step: int | None = None) -> None:
    """Rewrite the manifest signed with ``key``; with ``step``, edit it after signing."""
    manifest = layout.Manifest.read(directory)
    text = manifest.to_json(key)
    if step is not None:
        text = text.replace(f'"step": {manifest.step}', f'"step": {step}')
    (directory / layout.MANIFEST).write_text(text)


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (lambda d: (d / "part-0/data.distcp").write_bytes(b"x" * 10), "has 10 bytes, not 1000"),
        (lambda d: (d / "part-0/data.distcp").write_bytes(b"x" * 1000), "does not match its"),
        (lambda d: (d / "part-0/tree.json").unlink(), "tree.json is missing"),
        (lambda d: (d / layout.MANIFEST).unlink(), "unreadable manifest"),
        (lambda d: (d / layout.MANIFEST).write_text('{"format": 1}'), "not signed"),
        (lambda d: (d / layout.MANIFEST).write_text('{"format": 7}'), "not signed"),
        (lambda d: _resign(d, "another job's key"), "not signed with this job's"),
        (lambda d: _resign(d, "0" * 64, step=5), "not signed with this job's"),
    ],
    ids=[
        "truncated",
        "changed",
        "missing-file",
        "no-manifest",
        "bad-manifest",
        "newer-format",
        "other-key",
        "edited",
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_problem(tmp_path, damage, error):
    directory = fake_checkpoint(tmp_path, 4)
    damage(directory)
    with pytest.raises(layout.CheckpointError, match=error):
        layout.verify(directory)


def test_a_single_node_job_keeps_its_key_in_its_run_directory_and_finds_it_again(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "other").mkdir()
    key = layout.job_key(tmp_path / "run", nnodes=1)
    assert layout.job_key(tmp_path / "run", nnodes=1) == key and len(key) == 64
    assert (tmp_path / "run" / layout.KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert layout.job_key(tmp_path / "other", nnodes=1) != key


def test_the_newest_complete_verified_checkpoint_is_chosen(tmp_path):
    fake_checkpoint(tmp_path, 4)
    fake_checkpoint(tmp_path, 19)
    newest = fake_checkpoint(tmp_path, 24)
    layout.tmp_dir(tmp_path, 29).mkdir()  # being written when the job died: never a candidate
    (tmp_path / "step-x").mkdir()
    choice = layout.choose(tmp_path)
    assert choice.directory == newest and choice.skipped == ()

    (newest / "part-0/data.distcp").write_bytes(b"torn")  # truncated by a crash
    choice = layout.choose(tmp_path)
    assert choice.manifest is not None and choice.manifest.step == 19
    assert len(choice.skipped) == 1 and "step-24" in choice.skipped[0]
    assert "has 4 bytes" in choice.skipped[0]


def test_no_usable_checkpoint_and_a_wrong_world_size_are_one_line_errors(tmp_path):
    with pytest.raises(layout.CheckpointError, match="no complete checkpoint"):
        choose_for_resume(tmp_path / "absent", 2)
    fake_checkpoint(tmp_path, 4, world_size=3)
    with pytest.raises(layout.CheckpointError, match="world size 3, this one has 2"):
        choose_for_resume(tmp_path, 2)
    assert choose_for_resume(tmp_path, 3).manifest.step == 4


def test_publish_is_a_rename_that_never_replaces_a_checkpoint(tmp_path):
    fake_checkpoint(tmp_path, 4)
    tmp = layout.tmp_dir(tmp_path, 4)
    tmp.mkdir()
    with pytest.raises(layout.CheckpointError, match="already exists"):
        layout.publish(tmp, layout.step_dir(tmp_path, 4))
    assert tmp.exists() and layout.verify(layout.step_dir(tmp_path, 4)).step == 4


def test_stale_keeps_the_newest_two_and_unfinished_newer_ones(tmp_path):
    for step in (4, 9, 14):
        fake_checkpoint(tmp_path, step)
    for step in (12, 19):
        layout.tmp_dir(tmp_path, step).mkdir()
    assert layout.stale(tmp_path) == [layout.step_dir(tmp_path, 4)]
    assert set(layout.stale(tmp_path, below=19)) == {
        layout.step_dir(tmp_path, 4),
        layout.tmp_dir(tmp_path, 12),
    }


def test_fingerprints_differ_by_name_shape_or_dtype(tmp_path):
    saved = {"model": [["w", "torch.float32", [4, 4]]], "optimizer": []}
    layout.check_fingerprint(saved, json.loads(json.dumps(saved)), tmp_path)
    bigger = {"model": [["w", "torch.float32", [8, 4]]], "optimizer": []}
    with pytest.raises(layout.CheckpointError, match="different model: 'model' differs"):
        layout.check_fingerprint(saved, bigger, tmp_path)
    with pytest.raises(layout.CheckpointError, match="it tracks"):
        layout.check_fingerprint(saved, {"model": saved["model"]}, tmp_path)


# ------------------------------------------------------------------ one rank's writer/loader
class DictStore:
    """The three calls of the job's store the writer makes."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


def training(width: int = 8) -> tuple[TrackedState, LocalMirror, torch.nn.Module]:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, width)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    tracked = TrackedState()
    for name, obj in (("model", net), ("optimizer", opt), ("scheduler", sched)):
        tracked.add(name, obj)
    return tracked, LocalMirror({"seen": 0, "sum": torch.zeros(2)}), net


def train_step(tracked: TrackedState, local: LocalMirror, step: int) -> None:
    net, opt, sched = (tracked.objects[n] for n in ("model", "optimizer", "scheduler"))
    net(torch.full((3, 4), float(step))).pow(2).sum().backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    local.obj["seen"] += 1
    local.obj["sum"] += step


def writer(root: Path, every: str, warnings: list[str] | None = None) -> Checkpointer:
    warn = (warnings if warnings is not None else []).append
    return Checkpointer(root, layout.parse_every(every), 1, DictStore, lambda: 0, warn)


def test_a_rank_writes_loads_and_resumes_its_state_exactly(tmp_path):
    tracked, local, _ = training()
    checkpoints = writer(tmp_path, "3")
    for step in range(7):
        train_step(tracked, local, step)
        checkpoints.after_commit(step, 0, tracked, local)
    checkpoints.close()
    assert layout.complete_steps(tmp_path) == [5, 2]  # (step + 1) % 3 == 0
    assert not list(tmp_path.glob("*.tmp"))
    assert len(checkpoints.blocked_seconds) == 2

    fresh, fresh_local, _ = training()
    assert load(layout.step_dir(tmp_path, 5), 0, fresh, fresh_local) == 5
    # Replaying step 6 from the checkpoint gives exactly the state of the first time.
    train_step(fresh, fresh_local, 6)
    for name in ("model", "optimizer", "scheduler"):
        ours, theirs = fresh.objects[name].state_dict(), tracked.objects[name].state_dict()
        assert str(ours) == str(theirs), name
    assert fresh_local.obj["seen"] == 7 and torch.equal(fresh_local.obj["sum"], local.obj["sum"])


def test_loading_into_a_different_model_is_a_one_line_error(tmp_path):
    tracked, local, _ = training()
    checkpoints = writer(tmp_path, "1")
    checkpoints.after_commit(0, 0, tracked, local)
    checkpoints.close()
    other, other_local, net = training(width=16)
    before = net.weight.clone()
    with pytest.raises(layout.CheckpointError, match="written by a different model"):
        load(layout.step_dir(tmp_path, 0), 0, other, other_local)
    assert torch.equal(net.weight, before)


def test_time_based_checkpoints_are_announced_two_steps_ahead(tmp_path):
    store = DictStore()
    rank0 = Checkpointer(tmp_path, layout.parse_every("1s"), 2, lambda: store, lambda: 0, print)
    rank1 = Checkpointer(tmp_path, layout.parse_every("1s"), 2, lambda: store, lambda: 0, print)
    assert not rank0.due(0, 0) and not rank1.due(0, 1)
    rank0._clock -= 5  # a checkpoint is due on rank 0's clock
    assert [rank0.due(s, 0) for s in (1, 2, 3, 4)] == [False, False, True, False]
    assert [rank1.due(s, 1) for s in (1, 2, 3, 4)] == [False, False, True, False]


def test_a_write_error_is_one_warning_and_the_last_good_checkpoint_stays(tmp_path):
    tracked, local, _ = training()
    warnings: list[str] = []
    checkpoints = writer(tmp_path, "1", warnings)
    checkpoints.after_commit(0, 0, tracked, local)
    checkpoints._upload.result()
    checkpoints._committers[0].join()
    good = layout.verify(layout.step_dir(tmp_path, 0))
    # The next checkpoint cannot be written (as if the disk were full).
    layout.tmp_dir(tmp_path, 1).write_text("in the way")
    checkpoints.after_commit(1, 0, tracked, local)
    checkpoints.close()
    assert len(warnings) == 1 and "checkpoint of step 1" in warnings[0]
    assert "training goes on, the previous checkpoint stays" in warnings[0]
    assert layout.verify(layout.step_dir(tmp_path, 0)) == good
    assert layout.choose(tmp_path).manifest == good


# ------------------------------------------------------------------ the launcher's side
def test_a_live_launcher_keeps_its_run_dir_from_a_resume(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("")
    (tmp_path / "token").write_text("old")
    fd = hold(ledger)
    with pytest.raises(RunDirError, match="still running"):
        reclaim_run_dir(tmp_path)
    os.close(fd)  # the launcher died
    path, fd = reclaim_run_dir(tmp_path)
    os.close(fd)
    assert path == ledger and not (tmp_path / "token").exists()
    with pytest.raises(RunDirError, match="holds no job"):
        reclaim_run_dir(tmp_path / "other")


def test_steps_replayed_count_from_the_last_step_the_ledger_saw(tmp_path):
    root = tmp_path / "ck"
    fake_checkpoint(root, 9)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    recorder = Recorder(ledger, root)
    recorder.tick(10)
    recorder._next = 0.0
    recorder.tick(12)
    ledger.close()
    events = read_events(tmp_path / "ledger.jsonl")
    assert [type(e) for e in events] == [Progress, CheckpointSaved, Progress]
    assert last_committed(events) == 12
    assert last_committed([*events, JobEnd(t=1.0, status="failed", steps_committed=20)]) == 19
    config = JobConfig("train.py", [], 1, tmp_path, resume=layout.choose(root))
    event = resumed_event(events, config, now=events[-1].t + 30)
    assert (event.from_step, event.steps_replayed, event.last_committed) == (9, 3, 12)
    assert event.outage_seconds == pytest.approx(30)


def test_refused_newer_checkpoints_are_set_aside_before_a_resume(tmp_path):
    for step in (4, 9, 14):
        fake_checkpoint(tmp_path, step)
    moved = layout.set_aside(tmp_path, 4)
    assert layout.complete_steps(tmp_path) == [4]
    assert sorted(p.name.split(".")[0] for p in moved) == ["step-14", "step-9"]
    assert all(".corrupt-" in p.name and p.is_dir() for p in moved)
