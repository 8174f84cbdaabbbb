"""Agent side of transparent mode: cloning a parked worker, or moving it, with CRIU.

:func:`clone` dumps a parked worker with ``--leave-running`` and restores the images as a new
job process in a fresh PID namespace; :func:`migrate` dumps it (CRIU then kills it) and
restores it the same way. What is dumped is the worker's whole :mod:`nsinit` tree (its PID
namespace's init with it), so a copy has the original's shape and can be copied again. Either
way the copy gets NEW pipes in place of the ones the snapshot holds to the outside
(stdout/stderr, both park pipes, the init's status pipe), so its output and its instructions
are its own, and it is a job process like any other: its parent is an :mod:`nsinit` outer,
started through the parent-death trampoline (it dies with the launcher, and everything in its
PID namespace with it), whose exit status is the copy's, whose output pipe is
:attr:`Clone.process`'s ``stdout``, and which forwards the agent's signals (SIGTERM, ...) to
the copy.

Both return while the copy (and a clone's donor) still wait in :func:`park.wait`: the caller
answers each with :meth:`park.Channel.instruct` -- the donor ``CONTINUE``, the copy ``BECOME``
or ``CONTINUE``. The images are written under ``RUN_DIR/snapshots`` and removed whatever
happens; CRIU's logs too, unless it failed (a :class:`criu.CriuError` names the log it keeps).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from torchrelay.transparent import criu, cuda, nsinit
from torchrelay.transparent.park import Channel, Notice


@dataclass
class Parked:
    """A worker waiting in :func:`park.wait`: the pid (here) of its job process (the
    :mod:`nsinit` outer it runs under), its agent-side park channel, and the notice it parked
    with (which its instruction must answer)."""

    pid: int
    channel: Channel
    notice: Notice


@dataclass
class Clone:
    """A restored copy, parked: answer ``notice`` on ``channel`` to release it.

    ``process`` is the copy's job process (exit status, signals, ``stdout`` with stderr merged);
    ``pid`` the copy as this host sees it; ``bytes``/``dump_seconds``/``restore_seconds`` what
    the snapshot cost.
    """

    process: subprocess.Popen[bytes]
    pid: int
    channel: Channel
    notice: Notice
    bytes: int
    dump_seconds: float
    restore_seconds: float


# A migration's result is the same record: the original is gone, the copy is all there is.
Migrated = Clone


def clone(donor: Parked, run_dir: Path) -> Clone:
    """Copy the parked ``donor`` into a new process; the donor stays parked.

    Raises :class:`criu.CriuUnavailable` or :class:`criu.CriuError` (the donor is untouched
    then, still parked: answer it ``CONTINUE``), and :class:`cuda.DeviceStateUnavailable` for a
    CUDA worker (see :func:`cuda.refuse_clone`).
    """
    cuda.refuse_clone(nsinit.tree(donor.pid).worker)
    return _copy(donor, run_dir, leave_running=True)


def migrate(worker: Parked, run_dir: Path) -> Migrated:
    """Move the parked ``worker`` into a new process: dump it (CRIU kills it), restore it.

    The caller must expect the original's death (SIGKILL) before calling. A failed dump
    (:class:`criu.DumpFailed`) leaves the worker alive and parked; a failed restore
    (:class:`criu.RestoreFailed`) leaves it dead. A CUDA worker's device state goes through
    host memory (:mod:`cuda`): :class:`cuda.DeviceStateUnavailable` or
    :class:`cuda.DeviceStateError` before the dump leave it alive, on its GPU.
    """
    return _copy(worker, run_dir, leave_running=False)


def _copy(parked: Parked, run_dir: Path, *, leave_running: bool) -> Clone:
    tool = criu.find_criu()
    # The tree to dump (init and worker), and the snapshot's outside pipes, named before the
    # dump (after a migration's there is no process to ask).
    tree = nsinit.tree(parked.pid)
    names = criu.fd_names(tree.worker, [1, 2, *parked.channel.child_fds])
    images = run_dir / "snapshots" / f"{parked.pid}-{time.time_ns()}"
    channel = Channel.open()
    replace = dict(zip(parked.channel.child_fds, channel.child_fds, strict=True))
    # Only pipes are outside resources to replace (files are reopened by path); stdout and
    # stderr share one pipe (the agent merges them, and the init has it too): it becomes fd 1,
    # the restore's stdout.
    inherit = {name: replace.get(fd, 1) for fd, name in names.items() if name.startswith("pipe:")}
    device_tool: str | None = None
    try:
        device_tool = cuda.tool_for(tree.worker)  # None: no CUDA state to move
        if device_tool is not None:
            cuda.suspend(device_tool, tree.worker)  # unlocks it again if it fails
        try:
            stats = criu.dump(tree.init, images, leave_running=leave_running, criu=tool)
        except BaseException:
            if device_tool is not None:  # CRIU let it run on: back onto its GPU
                cuda.resume(device_tool, tree.worker)
            raise
        if device_tool is not None and leave_running:  # the donor goes on
            cuda.resume(device_tool, tree.worker)
        restored = criu.restore(
            images,
            inherit_fds=inherit,
            status_pipe=tree.status_pipe,
            criu=tool,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except BaseException:
        channel.close()
        raise
    finally:
        channel.close_child_ends()
        shutil.rmtree(images, ignore_errors=True)  # hundreds of MB: never left behind
    # The copy reads and writes its new pipes under its source's fd numbers (CRIU restores fds
    # under their numbers): those are the numbers to name when the copy is copied in turn.
    channel.child_fds = parked.channel.child_fds
    if device_tool is not None:
        try:
            cuda.resume(device_tool, restored.pid)
        except cuda.DeviceStateError as exc:  # a copy that cannot get its GPU back is no copy
            restored.process.kill()
            restored.process.wait()
            channel.close()
            raise criu.RestoreFailed(str(exc), restored.log) from None
    for log in (stats.log, restored.log):
        log.unlink(missing_ok=True)
    return Clone(
        process=restored.process,
        pid=restored.pid,
        channel=channel,
        notice=parked.notice,
        bytes=stats.bytes,
        dump_seconds=stats.seconds,
        restore_seconds=restored.seconds,
    )
