"""Durable checkpoints on disk: the layout, the manifest, verification and the choice to resume.

A checkpoint of step ``S`` is a directory ``DIR/step-S``, written as ``DIR/step-S.tmp`` and
renamed only once every rank's part is written and the manifest describes every file::

    step-S/manifest.json      step, world size, model fingerprint, size + SHA-256 per file,
                              signed (HMAC-SHA256) with the job's checkpoint key
    step-S/part-0/            the tracked (replicated) state, written by rank 0 only, and
                              rank 0's ``track(local=...)`` state
    step-S/part-R/            rank R's ``track(local=...)`` state (none without local state)

Each part is a ``torch.distributed.checkpoint`` directory of tensors plus ``tree.json``, the
state's structure in the transfer schema (JSON), written by one rank. DCP keeps its own index
of a part (``.metadata``) as a pickle, which loading unpickles: so nothing is loaded unless the
manifest's signature holds and every file matches its SHA-256 -- a directory another job or a
person wrote, or one damaged, is refused before any of its bytes are parsed.

The key (:func:`job_key`) is derived from the job's shared secret on several nodes (the same
on every node, and again when the job is resumed with the same secret); a job of one node
keeps a random one in its run directory (owner-only), where ``--resume`` finds it again. The
launcher puts it in the environment (:data:`KEY_ENV`) that its processes inherit.
Pure: no torch, no processes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1
MANIFEST = "manifest.json"
TMP_SUFFIX = ".tmp"
KEEP = 2
"""Complete checkpoints kept: the newest and the one before (if the newest turns out corrupt)."""
# What the launcher tells a worker (runtime/checkpoint.py reads it).
DIR_ENV, EVERY_ENV, RESUME_ENV = (
    "TORCHRELAY_CHECKPOINT_DIR",
    "TORCHRELAY_CHECKPOINT_EVERY",
    "TORCHRELAY_RESUME_FROM",
)
KEY_ENV, KEY_FILE = "TORCHRELAY_CHECKPOINT_KEY", "checkpoint.key"
_NAME = re.compile(r"^step-(\d+)$")
_EVERY = re.compile(r"^(\d+)([sm]?)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, or a bad checkpoint option; one line saying why."""


@dataclass(frozen=True)
class Every:
    """``--checkpoint-every``: every ``steps`` committed steps, or every ``seconds``."""

    steps: int | None = None
    seconds: float | None = None

    def __str__(self) -> str:
        return f"{self.steps}" if self.steps is not None else f"{self.seconds:g}s"


def parse_every(text: str) -> Every:
    """``"500"`` (steps), ``"90s"``, ``"30m"``; :class:`CheckpointError` with one line else."""
    match = _EVERY.match(text.strip())
    if match is None or int(match.group(1)) <= 0:
        raise CheckpointError(
            f"--checkpoint-every must be N (steps), Ns (seconds) or Nm (minutes) with N > 0, "
            f"not {text!r}"
        )
    number, unit = int(match.group(1)), match.group(2)
    if not unit:
        return Every(steps=number)
    return Every(seconds=float(number * (60 if unit == "m" else 1)))


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}"


def tmp_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}{TMP_SUFFIX}"


def part(tmp: Path, rank: int) -> Path:
    """What rank ``rank`` writes (see the module doc)."""
    return tmp / f"part-{rank}"


def done_marker(tmp: Path, rank: int) -> Path:
    """Rank ``rank``'s part of the checkpoint in ``tmp`` is written (and fsynced)."""
    return tmp / f"done-{rank}"


def failed_marker(tmp: Path, rank: int) -> Path:
    """Rank ``rank`` could not write its part: the checkpoint in ``tmp`` is abandoned."""
    return tmp / f"failed-{rank}"


def tmp_step(path: Path) -> int | None:
    """The step of an unfinished checkpoint directory ``step-S.tmp``; None for anything else."""
    match = _NAME.match(path.name.removesuffix(TMP_SUFFIX))
    return int(match.group(1)) if match and path.name.endswith(TMP_SUFFIX) else None


def job_key(run_dir: Path, nnodes: int, create: bool = True) -> str:
    """The key that signs this job's manifests (see the module doc); on one node, made in
    ``run_dir`` (which must exist) unless it is there already, or -- ``create`` False, for
    ``--resume`` -- only read. Raises :class:`CheckpointError` with one line."""
    if nnodes > 1:
        secret = os.environ.get("TORCHRELAY_JOB_TOKEN", "")
        return hmac.new(secret.encode(), b"torchrelay checkpoint manifests", "sha256").hexdigest()
    path = run_dir / KEY_FILE
    try:
        if not create:
            raise FileExistsError
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise CheckpointError(
                f"cannot read the checkpoint key {path} ({exc.strerror or exc}): the "
                "checkpoints can be resumed only with the run directory that wrote them"
            ) from None
    except OSError as exc:
        raise CheckpointError(f"cannot make the checkpoint key {path}: {exc}") from None
    key = secrets.token_hex(32)
    with os.fdopen(fd, "w") as file:
        file.write(key)
    return key


def _key(key: str | None) -> str:
    found = key if key is not None else os.environ.get(KEY_ENV)
    if not found:
        raise CheckpointError(f"no checkpoint key (${KEY_ENV}): start the job with torchrelay run")
    return found


def _sign(body: dict[str, Any], key: str) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key.encode(), canonical, hashlib.sha256).hexdigest()


def file_digest(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 22):
            hasher.update(chunk)
    return hasher.hexdigest()


def describe_files(directory: Path) -> dict[str, dict[str, Any]]:
    """Every file under ``directory`` (relative path -> size and digest), the manifest aside."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        if relative != MANIFEST:
            files[relative] = {"size": path.stat().st_size, "sha256": file_digest(path)}
    return files


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    fingerprint: dict[str, Any]
    files: dict[str, dict[str, Any]]

    def to_json(self, key: str | None = None) -> str:
        """The manifest, signed with ``key`` (default: the job's, from the environment)."""
        body = {
            "format": FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "fingerprint": self.fingerprint,
            "files": self.files,
        }
        return json.dumps({**body, "mac": _sign(body, _key(key))}, indent=1)

    @classmethod
    def read(cls, directory: Path, key: str | None = None) -> Manifest:
        """The manifest of ``directory`` once its signature holds; else :class:`CheckpointError`."""
        try:
            data = json.loads((directory / MANIFEST).read_text())
            mac = data.pop("mac", "") if isinstance(data, dict) else ""
            if not hmac.compare_digest(str(mac), _sign(data, _key(key))):
                raise CheckpointError(
                    f"{directory}: its manifest is not signed with this job's checkpoint key "
                    "(written by another job, or changed since): refused"
                )
            if data.get("format") != FORMAT:
                raise CheckpointError(f"{directory}: unknown manifest format {data.get('format')}")
            return cls(
                step=int(data["step"]),
                world_size=int(data["world_size"]),
                fingerprint=dict(data["fingerprint"]),
                files={str(k): dict(v) for k, v in data["files"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"{directory}: unreadable manifest ({exc})") from None


def write_manifest(tmp: Path, manifest: Manifest, key: str | None = None) -> None:
    """Write the manifest, signed, durably (fsync of the file, then of the directory)."""
    path = tmp / MANIFEST
    text = manifest.to_json(key)
    with path.open("w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    _fsync_dir(tmp)


def publish(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` to ``final`` (atomic on one filesystem); never replaces an
    existing checkpoint (:class:`CheckpointError` then)."""
    if final.exists():
        raise CheckpointError(f"{final} already exists; the checkpoint stays in {tmp}")
    os.rename(tmp, final)
    _fsync_dir(final.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify(directory: Path, key: str | None = None) -> Manifest:
    """The manifest of a complete checkpoint, signed with the job's key, whose files all match
    it; else :class:`CheckpointError` naming the first problem (missing or unsigned manifest,
    missing, truncated or changed file)."""
    manifest = Manifest.read(directory, key)
    for relative, expected in manifest.files.items():
        path = directory / relative
        if not path.is_file():
            raise CheckpointError(f"{directory}: {relative} is missing")
        size = path.stat().st_size
        if size != expected.get("size"):
            wanted = expected.get("size")
            raise CheckpointError(f"{directory}: {relative} has {size} bytes, not {wanted}")
        if file_digest(path) != expected.get("sha256"):
            raise CheckpointError(f"{directory}: {relative} does not match its checksum")
    return manifest


def complete_steps(root: Path) -> list[int]:
    """Steps of the committed (renamed) checkpoints in ``root``, newest first."""
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(steps, reverse=True)


@dataclass(frozen=True)
class Choice:
    """The checkpoint to resume from (``None``: none usable) and why newer ones were skipped."""

    directory: Path | None
    manifest: Manifest | None
    skipped: tuple[str, ...]


def choose(root: Path) -> Choice:
    """The newest complete checkpoint whose files match its manifest."""
    skipped = []
    for step in complete_steps(root):
        directory = step_dir(root, step)
        try:
            manifest = verify(directory)
        except CheckpointError as exc:
            skipped.append(f"{exc}; skipped")
            continue
        return Choice(directory, manifest, tuple(skipped))
    return Choice(None, None, tuple(skipped))


def set_aside(root: Path, step: int) -> list[Path]:
    """Before resuming from ``step``: rename the newer (refused) checkpoints to
    ``step-S.corrupt-<time>``, kept for a look but out of the way of the steps to come."""
    moved = []
    for newer in (s for s in complete_steps(root) if s > step):
        target = root / f"step-{newer}.corrupt-{int(time.time())}"
        os.rename(step_dir(root, newer), target)
        moved.append(target)
    return moved


def check_compatible(manifest: Manifest, world_size: int, directory: Path) -> None:
    """The job resuming must have the checkpoint's world size (the local state is per rank)."""
    if manifest.world_size != world_size:
        raise CheckpointError(
            f"{directory} was written by a job of world size {manifest.world_size}, this one "
            f"has {world_size}: resume with the same --nnodes x --nproc-per-node"
        )


def check_fingerprint(saved: dict[str, Any], live: dict[str, Any], directory: Path) -> None:
    """The tracked objects and the modules' tensors (names, dtypes, shapes) are the same."""
    if saved == live:
        return
    if sorted(saved) != sorted(live):
        why = f"it tracks {sorted(saved)}, this script {sorted(live)}"
    else:
        name = next(n for n in sorted(saved) if saved[n] != live[n])
        theirs = sorted({json.dumps(e) for e in saved[name]} - {json.dumps(e) for e in live[name]})
        why = f"{name!r} differs (the checkpoint has {theirs[0] if theirs else 'fewer entries'})"
    raise CheckpointError(f"{directory} was written by a different model: {why}")


def stale(root: Path, keep: int = KEEP, below: int | None = None) -> list[Path]:
    """What to delete: complete checkpoints beyond the newest ``keep``, and unfinished
    ``.tmp`` directories of steps below ``below`` (abandoned: a newer one is under way)."""
    old = [step_dir(root, s) for s in complete_steps(root)[keep:]]
    if below is not None and root.is_dir():
        old += [p for p in root.iterdir() if (s := tmp_step(p)) is not None and s < below]
    return old
