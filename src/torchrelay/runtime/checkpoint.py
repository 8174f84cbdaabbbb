"""Asynchronous durable checkpoints of the tracked state, and loading one to resume.

**When.** Right after a step commits, on a step every rank picks alike without talking:
``--checkpoint-every N`` checkpoints after step ``S`` when ``(S + 1) % N == 0``. With a time
(``90s``, ``30m``) rank 0 alone reads the clock, and announces the step through the job's
store two steps ahead (``step + 2``); every rank reads the announcement at each commit. A DDP
step all-reduces, so no rank can commit step ``s + 1`` before rank 0 started it, by when the
announcement of ``s + 2`` is in the store: every rank sees it in time. (A rank that saw it too
late writes no part; that checkpoint never completes and is abandoned, never half-loaded.)

**What, by whom.** What ``torch.distributed.checkpoint.async_save`` does, without its
process-group check (the relay's group is not a gloo one): DCP's ``DefaultStager`` copies the
state to host memory (pinned on a GPU; its buffers reused across checkpoints) -- the only part
the loop waits for -- and ``dcp.save(no_dist=True)`` writes it in a background thread. The
replicated (tracked) state is the same on every rank, so rank 0 alone writes it (DCP's own
de-duplication of replicas would need its planning collectives, in the background, on the
group DDP uses); each rank writes its own ``track(local=...)`` state (see
:mod:`torchrelay.checkpoints` for the layout). No collective is involved: a failure of a peer
can never block this rank.

**Atomic.** A rank whose part is written (DCP fsyncs its files) creates ``done-R`` (``failed-R``
if it could not). Rank 0's committer thread of that step waits for every rank's marker, then
checksums the files, writes the manifest and renames ``step-S.tmp`` to ``step-S``; only the
newest :data:`~torchrelay.checkpoints.KEEP` are kept. It gives up on a ``failed-R``, and when a
recovery starts a new generation first: a rank that died may never write its part, and its
replacement writes none for a step it did not commit. Rank 0 removes abandoned directories at
its next checkpoint.

**Failures.** A write error (a full disk) is one warning line (stderr and the ledger's
``warning`` event, ``what="checkpoint_failed"``) and training goes on; the last good checkpoint
is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from torchrelay import checkpoints as layout
from torchrelay.runtime.tracked import TrackedState
from torchrelay.transfer.flatten import TensorSpec, flatten, unflatten

ANNOUNCE_KEY = "torchrelay/checkpoint/next"
TREE = "tree.json"
# no_dist is the point here (one writer per part, no collective): DCP need not warn about it.
warnings.filterwarnings("ignore", "torch.distributed is (disabled|unavailable)", UserWarning)
_POLL = 0.05  # seconds between rank 0's looks for the other ranks' markers


def fingerprint(tracked: TrackedState, local: Any) -> dict[str, Any]:
    """Names, dtypes and shapes of the tracked modules' tensors; the other objects by name."""
    found: dict[str, Any] = {}
    for name, obj in tracked.objects.items():
        if isinstance(obj, torch.nn.Module):
            found[name] = [[k, str(v.dtype), list(v.shape)] for k, v in obj.state_dict().items()]
        else:
            found[name] = []
    if local is not None:
        found["local="] = []
    return found


def _flat(state: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    tree, values, specs = flatten(state)
    for index, value in enumerate(values):
        tensors[f"{prefix}{index}"] = value.detach()
    return {"tree": tree, "specs": [s.to_json() for s in specs]}


def _read_part(directory: Path, name: str) -> Any:
    """``name`` ("replicated" or "local") of the part in ``directory``, tensors on the CPU."""
    trees = json.loads((directory / TREE).read_text())
    entry = trees[name]
    specs = [TensorSpec.from_json(s) for s in entry["specs"]]
    prefix = name[0] + "."
    template = {f"{prefix}{i}": torch.empty(s.shape, dtype=s.dtype) for i, s in enumerate(specs)}
    if template:
        dcp.load(template, checkpoint_id=str(directory), no_dist=True)
    return unflatten(entry["tree"], [template[f"{prefix}{i}"] for i in range(len(specs))])


def _write(staged: dict[str, torch.Tensor], directory: Path) -> None:
    if staged:  # DCP's file writer fsyncs every file it writes
        dcp.save(staged, checkpoint_id=str(directory), no_dist=True)


def load(directory: Path, rank: int, tracked: TrackedState, local: Any) -> int:
    """Load checkpoint ``directory`` into the tracked state (and ``local``'s rank ``rank``
    entry); return its step. :class:`~torchrelay.checkpoints.CheckpointError` (one line) if it
    was written by another model."""
    manifest = layout.verify(directory)  # signed, every file as written: only then parsed
    layout.check_fingerprint(manifest.fingerprint, fingerprint(tracked, local), directory)
    state = _read_part(layout.part(directory, 0), "replicated")
    tracked.load(state, tracked.state())
    if local is not None:
        local.load_state_dict(_read_part(layout.part(directory, rank), "local"))
    return manifest.step


def resume_from_environ(rank: int, tracked: TrackedState, local: Any) -> int:
    """The step of the checkpoint ``torchrelay run --resume`` chose, loaded; -1 if none (once:
    a second loop of the script goes on from where the first ended)."""
    directory = os.environ.pop(layout.RESUME_ENV, "")
    if not directory:
        return -1
    try:
        step = load(Path(directory), rank, tracked, local)
    except layout.CheckpointError as exc:  # one line, not a traceback: the job stops on it
        raise SystemExit(f"torchrelay: cannot resume: {exc}") from None
    print(f"torchrelay: rank {rank} resumed from {directory} (step {step})", flush=True)
    return step


class Checkpointer:
    """One rank's side of the checkpoints; see the module doc. ``store()`` is the job's store
    (it may change when the controller moves), ``generation()`` the rank's generation (a
    recovery abandons the checkpoints still waiting for parts), ``warn(line)`` reports a
    failure."""

    def __init__(
        self,
        root: Path,
        every: layout.Every,
        world_size: int,
        store: Callable[[], dist.Store],
        generation: Callable[[], int],
        warn: Callable[[str], None],
    ) -> None:
        self.root = root
        self.every = every
        self.world_size = world_size
        self._store = store
        self._generation = generation
        self._warn = warn
        self._upload: Future[Any] | None = None
        self._committers: dict[int, threading.Thread] = {}
        self._closing = threading.Event()
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._clock = time.monotonic()  # rank 0: since the last announcement (or the start)
        self._announced = -1
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=torch.cuda.is_available(),
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
        )
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="torchrelay-checkpoint")
        self.blocked_seconds: list[float] = []  # how long the loop waited, per checkpoint

    @classmethod
    def from_environ(
        cls,
        world_size: int,
        store: Callable[[], dist.Store],
        generation: Callable[[], int],
        warn: Callable[[str], None],
    ) -> Checkpointer | None:
        root = os.environ.get(layout.DIR_ENV)
        if not root:
            return None
        every = layout.parse_every(os.environ[layout.EVERY_ENV])
        return cls(Path(root), every, world_size, store, generation, warn)

    # ------------------------------------------------------------------ the step boundary
    def due(self, step: int, rank: int) -> bool:
        """Whether the state as of committed ``step`` is checkpointed (alike on every rank)."""
        if self.every.steps is not None:
            return (step + 1) % self.every.steps == 0
        assert self.every.seconds is not None
        store = self._store()
        if rank == 0 and self._announced < step:
            if time.monotonic() - self._clock >= self.every.seconds:
                self._clock = time.monotonic()
                self._announced = step + 2
                store.set(ANNOUNCE_KEY, str(self._announced))
        elif rank != 0 and store.check([ANNOUNCE_KEY]):
            self._announced = int(store.get(ANNOUNCE_KEY))
        return step == self._announced

    def after_commit(self, step: int, rank: int, tracked: TrackedState, local: Any) -> None:
        """Called on every rank right after ``step`` committed."""
        self._report_errors()
        if not self.due(step, rank):
            return
        started = time.perf_counter()
        if self._upload is not None:  # one write at a time (it reuses the staging buffers)
            self._upload.exception()
        tmp = layout.tmp_dir(self.root, step)
        if rank == 0:
            self._remove_abandoned(step)
        tensors: dict[str, torch.Tensor] = {}
        trees = {}
        if rank == 0:
            trees["replicated"] = _flat(tracked.state(), "r.", tensors)
        if local is not None:
            trees["local"] = _flat(local.state_dict(), "l.", tensors)
        directory = layout.part(tmp, rank)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if trees:
                (directory / TREE).write_text(json.dumps(trees))
            staged = self._stager.stage(tensors) if tensors else {}
        except (OSError, RuntimeError) as exc:
            self._failed(step, exc, tmp, rank)
            return
        upload = self._writer.submit(_write, staged, directory)
        self._upload = upload
        upload.add_done_callback(lambda f: self._mark_done(f, tmp, rank, step))
        if rank == 0:
            committer = threading.Thread(
                target=self._commit,
                args=(tmp, step, fingerprint(tracked, local), self._generation()),
                name=f"torchrelay-checkpoint-{step}",
                daemon=True,
            )
            self._committers[step] = committer
            committer.start()
        self.blocked_seconds.append(time.perf_counter() - started)

    def close(self, timeout: float = 60.0) -> None:
        """At the end of the loop: let this rank's write, and rank 0's commits, finish (those
        still waiting for a part after ``timeout`` are abandoned)."""
        if self._upload is not None:
            with contextlib.suppress(TimeoutError):  # still writing: it finishes at exit
                self._upload.exception(timeout=timeout)
        deadline = time.monotonic() + timeout
        for committer in self._committers.values():
            committer.join(max(0.0, deadline - time.monotonic()))
        self._closing.set()
        for committer in self._committers.values():
            committer.join()
        self._writer.shutdown()
        self._report_errors()

    # ------------------------------------------------------------------ helpers
    def _remove_abandoned(self, step: int) -> None:
        """Rank 0: unfinished checkpoints of earlier steps whose committer gave up."""
        self._committers = {s: c for s, c in self._committers.items() if c.is_alive()}
        for path in layout.stale(self.root, below=step):
            if layout.tmp_step(path) not in self._committers:
                shutil.rmtree(path, ignore_errors=True)

    def _mark_done(self, upload: Future[Any], tmp: Path, rank: int, step: int) -> None:
        error = upload.exception()
        if error is not None:
            self._failed(step, error, tmp, rank)
            return
        try:
            with layout.done_marker(tmp, rank).open("w") as file:
                os.fsync(file.fileno())
        except OSError as exc:
            self._failed(step, exc, tmp, rank)

    def _commit(self, tmp: Path, step: int, live: dict[str, Any], generation: int) -> None:
        """Rank 0's committer of ``step``: every part written -> manifest -> rename -> prune.
        Gives up (the directory is removed at the next checkpoint) when a rank's part failed,
        a recovery started a new generation first, or the loop ended without it."""
        markers = [layout.done_marker(tmp, r) for r in range(self.world_size)]
        while not all(m.exists() for m in markers):
            if any(layout.failed_marker(tmp, r).exists() for r in range(self.world_size)):
                return
            if self._generation() != generation or self._closing.wait(_POLL):
                return
        try:
            for marker in markers:
                marker.unlink()
            manifest = layout.Manifest(
                step=step,
                world_size=self.world_size,
                fingerprint=live,
                files=layout.describe_files(tmp),
            )
            layout.write_manifest(tmp, manifest)
            layout.publish(tmp, layout.step_dir(self.root, step))
            for path in layout.stale(self.root):
                shutil.rmtree(path, ignore_errors=True)
        except (OSError, layout.CheckpointError) as exc:
            self._failed(step, exc, None, 0)

    def _failed(self, step: int, error: BaseException, tmp: Path | None, rank: int) -> None:
        """Report a failed write in one line; tell rank 0's committer (``failed-R``)."""
        if tmp is not None:
            if not tmp.exists():
                return  # abandoned and removed meanwhile: nothing to report
            with contextlib.suppress(OSError):
                layout.failed_marker(tmp, rank).touch()
        line = (
            f"torchrelay: checkpoint of step {step} in {self.root} failed "
            f"({type(error).__name__}: {error}); training goes on, the previous checkpoint stays"
        )
        with self._lock:
            self._errors.append(line.replace("\n", " "))

    def _report_errors(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        for line in errors:
            self._warn(line)
