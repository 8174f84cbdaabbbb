"""Starting the job's processes so that none outlives the launcher, and stopping them whole.

Every process is started through the :mod:`deathsig` trampoline: the kernel SIGKILLs it when
the launcher dies, however it dies. Linux sends that parent-death signal when the *thread*
that forked the child exits, not the process -- and spares are started from the controller's
recovery thread and from RPC threads, which end. So every ``Popen`` runs on one spawner
thread that lives as long as the process (:func:`spawn`); a child forked by a thread that
then ends would be killed with it.

Each process also leads a session (and process group) of its own, as under torchrun
(torch.distributed.elastic's SubprocessHandler): a terminal's Ctrl-C reaches the launcher
only, which then stops the job in order; and signalling the group (:func:`signal_group`)
reaches what a worker started itself (data loader workers, a compiler) too. Those
grandchildren are not bound to the launcher's death: PyTorch's data loader workers watch
their parent and leave within seconds of it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

GROUP_END_TIMEOUT_S = 5.0
GROUP_END_POLL_S = 0.005  # no pidfd for a group: its end is polled
# A group that still answers may hold zombies only: /proc is read at most this often to see.
GROUP_SCAN_S = 0.05

TRAMPOLINE = Path(__file__).with_name("deathsig.py")

_requests: queue.Queue[tuple[list[str], dict[str, Any], Future]] = queue.Queue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def spawn(command: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **popen)``, in a session of its own, SIGKILLed by the
    kernel if this process dies; forked on the spawner thread (see the module docstring).

    Thread-safe; raises what ``Popen`` raises.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            # A daemon that never returns: it ends with the process, never before.
            _spawner = threading.Thread(target=_serve, name="torchrelay-spawner", daemon=True)
            _spawner.start()
    done: Future[subprocess.Popen[bytes]] = Future()
    if sys.platform.startswith("linux"):  # elsewhere there is no parent-death signal
        command = [sys.executable, "-I", "-S", str(TRAMPOLINE), str(os.getpid()), *command]
    _requests.put((command, {**popen, "start_new_session": True}, done))
    return done.result()


def _serve() -> None:
    while True:
        command, popen, done = _requests.get()
        try:
            done.set_result(subprocess.Popen(command, **popen))
        except BaseException as exc:  # handed to the caller, this thread must go on
            done.set_exception(exc)


def signal_group(pid: int, signum: int) -> None:
    """Send ``signum`` to the process group led by ``pid`` (started by :func:`spawn`); a
    group that no longer exists is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def ask_group_to_end(pid: int) -> None:
    """SIGTERM the process group led by ``pid``, and SIGCONT it: a stopped process acts on the
    SIGTERM now."""
    signal_group(pid, signal.SIGTERM)
    signal_group(pid, signal.SIGCONT)


def await_group_end(pid: int, timeout: float = GROUP_END_TIMEOUT_S) -> bool:
    """Wait until the process group led by ``pid`` has no live member left: after a SIGKILL to
    it, what a process left in its group (its exit holder, which unmaps its memory; data
    loader workers) has ended when this returns ``True``. A zombie counts as ended: its memory
    and descriptors are released, and reaping it is its parent's business (an orphan's is
    init's, which in a container may reap late or never). ``False`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    scanned = 0.0
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        now = time.monotonic()
        if now - scanned >= GROUP_SCAN_S:
            scanned = now
            if not _live_members(pid):
                return True
        if now > deadline:
            return False
        time.sleep(GROUP_END_POLL_S)


def _live_members(group: int) -> bool:
    """Whether a process of process group ``group`` is alive (not a zombie)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # it ended meanwhile
            continue
        if int(fields[2]) == group and fields[0] != b"Z":
            return True
    return False
