"""Device memory in a snapshot: NVIDIA's ``cuda-checkpoint`` around CRIU (the GPU path).

CRIU copies what the kernel knows of a process; a worker with a CUDA context also has state on
the GPU (device memory, streams, the driver's objects) that CRIU cannot see. NVIDIA driver
>= 570 exposes a checkpoint API for it, driven per process by the ``cuda-checkpoint`` utility
(github.com/NVIDIA/cuda-checkpoint):

- before the dump, :func:`suspend`: ``--action lock`` (new CUDA calls block, running work
  drains) then ``--action checkpoint`` (device memory is copied into the process's host
  memory and the GPU released), so CRIU dumps it like a CPU process;
- after a restore (in the copy) and after a ``--leave-running`` dump (in the donor),
  :func:`resume`: ``--action restore`` (back onto the same GPU) then ``--action unlock``.

Contract: :func:`tool_for` says whether a worker needs this at all (it maps ``libcuda``) and,
if so, returns the utility, or raises :class:`DeviceStateUnavailable` with one line (no
utility, no NVIDIA driver, a driver older than 570). Every failure of the utility is a
:class:`DeviceStateError`, one line naming the action and the pid; :func:`suspend` unlocks a
process whose checkpoint failed, so it runs on where it was.

Limit: the restore puts a copy back on its donor's GPU. A clone that must take another GPU
(a dead slot's) would need the checkpoint API's GPU remapping (``CUcheckpointRestoreArgs``),
which this does not drive: :func:`refuse_clone` says so in one line. A migration keeps its GPU.
Not run on a GPU yet: the one GPU run so far (an H200, 2026-12-04) covered model-aware mode
only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

MIN_DRIVER = 570
ENV = "TORCHRELAY_CUDA_CHECKPOINT"
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
TIMEOUT = 300.0  # a checkpoint copies all device memory to the host: tens of GB take a while


class DeviceStateUnavailable(RuntimeError):
    """A CUDA worker cannot be snapshotted here; the message says what is missing."""


class DeviceStateError(RuntimeError):
    """``cuda-checkpoint`` failed on a process; one line."""


def uses_cuda(pid: int) -> bool:
    """Whether process ``pid`` has loaded the CUDA driver library (so it may hold a context)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return re.search(r"/libcuda\.so[.\d]*$", maps, re.M) is not None


def driver_major(version_file: Path = DRIVER_VERSION_FILE) -> int | None:
    """The NVIDIA kernel module's major version (``570`` of ``570.86.15``), or ``None``."""
    try:
        text = version_file.read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+)\.", text)
    return int(found.group(1)) if found else None


def tool_for(pid: int, version_file: Path = DRIVER_VERSION_FILE) -> str | None:
    """``None`` for a worker without CUDA; else the ``cuda-checkpoint`` to snapshot it with."""
    if not uses_cuda(pid):
        return None
    major = driver_major(version_file)
    if major is None or major < MIN_DRIVER:
        found = "no NVIDIA driver" if major is None else f"NVIDIA driver {major}"
        raise DeviceStateUnavailable(
            f"process {pid} uses CUDA and snapshotting its GPU state needs NVIDIA driver >= "
            f"{MIN_DRIVER} (found {found})"
        )
    tool = os.environ.get(ENV) or shutil.which("cuda-checkpoint")
    if not tool:
        raise DeviceStateUnavailable(
            f"process {pid} uses CUDA: put NVIDIA's cuda-checkpoint utility on PATH (or set "
            f"{ENV}) to snapshot its GPU state"
        )
    return tool


def refuse_clone(pid: int) -> None:
    """Raise :class:`DeviceStateUnavailable` if ``pid`` holds CUDA state (see the module's
    limit: a clone would come back on its donor's GPU)."""
    if uses_cuda(pid):
        raise DeviceStateUnavailable(
            f"process {pid} uses CUDA: a clone would be restored onto its donor's GPU "
            "(remapping it to the dead slot's GPU is not built); drain/migration works"
        )


def suspend(tool: str, pid: int) -> None:
    """Lock ``pid``'s CUDA state and move it into host memory (before a dump)."""
    _action(tool, "lock", pid)
    try:
        _action(tool, "checkpoint", pid)
    except DeviceStateError:
        _action(tool, "unlock", pid)  # it runs on, on its GPU, as before
        raise


def resume(tool: str, pid: int) -> None:
    """Put ``pid``'s CUDA state back on its GPU and let it run (after a restore)."""
    _action(tool, "restore", pid)
    _action(tool, "unlock", pid)


def _action(tool: str, action: str, pid: int) -> None:
    command = [tool, "--action", action, "--pid", str(pid)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeviceStateError(f"cuda-checkpoint --action {action} --pid {pid}: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        why = said[-1] if said else f"exit status {done.returncode}"
        raise DeviceStateError(f"cuda-checkpoint --action {action} --pid {pid}: {why}")
