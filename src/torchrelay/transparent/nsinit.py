"""The PID namespace every transparent-mode worker runs in, and the parent of its copies.

A worker is the child of a small init, PID 1 of a PID namespace of its own, and CRIU always
dumps that whole tree (init and worker). CRIU 4.1 can dump a PID namespace only with its init
(a process of a nested namespace, alone, is refused), and restores such a dump in a fresh PID
namespace that it makes itself. So a copy's tree has the original's shape, at the same depth,
and can be copied again: a clone of a clone, a migration of a clone.

``python nsinit.py launch COMMAND...`` starts a worker: this process (the *outer*, the one its
agent supervises) enters a new PID namespace for its children and forks the init, which starts
COMMAND and waits. ``python nsinit.py restore REPORT_FD STATUS_PIPE criu restore -d ...``
restores a dumped tree: it runs CRIU as a child subreaper (the restored init, orphaned when
CRIU exits, becomes its child), with the init's status pipe (CRIU's name STATUS_PIPE, see
:func:`tree`) replaced by a new one of its own, and writes ONE JSON line to REPORT_FD:
``{"pid": <the restored init's pid>, "seconds": <restore time>}`` or ``{"error": <criu's exit
status>}``.

Either way the outer then forwards SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 and SIGCONT to the
worker's process group, and ends as the worker did: the same exit status, or killed by the
same signal, so its agent sees the worker's exit as it would see any. The init reports that
status through the status pipe (its fd :data:`STATUS_FD`; a namespace's init cannot kill
itself with a signal) and exits.

The init's state must survive a dump: it is plain Python waiting in ``poll`` on its status pipe
and its SIGCHLD wake-up pipe. It has no parent-death signal (a restored init's first parent is
the short-lived ``criu restore``); it leaves when its outer has gone instead (its status pipe
has no reader: POLLERR), and the kernel kills everything in the namespace with it. The outer
dies with the agent (the parent-death trampoline binds it). The init leads a session of its
own: CRIU refuses a tree whose session leader is outside its PID namespace.

Run by path with ``-I -S``: it imports only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWPID = 0x20000000
STATUS_FD = 3
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)
libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Tree:
    """A launched or restored job process, as CRIU sees it: ``init`` is the root of the tree to
    dump (its PID namespace's init), ``worker`` the process the script runs in, both as this
    host sees them; ``status_pipe`` is CRIU's name of the init's status pipe."""

    init: int
    worker: int
    status_pipe: str


def tree(outer: int) -> Tree:
    """The tree under the outer process ``outer``; :class:`OSError` if it is not (or no
    longer) one: a process with no single child, or an init with no status pipe."""
    init = only_child(outer)
    worker = None if init is None else only_child(init)
    if init is None or worker is None:
        raise ProcessLookupError(f"process {outer} runs no worker in a PID namespace of its own")
    return Tree(init, worker, os.readlink(f"/proc/{init}/fd/{STATUS_FD}"))


def only_child(pid: int) -> int | None:
    """The one child of ``pid``, or None (it has none, several, or has exited)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what} failed")


# ------------------------------------------------------------------ the init
def init(command: list[str], status_w: int) -> None:
    """PID 1 of the namespace: start ``command``, wait for it, report its status, exit."""
    os.setsid()
    # Popen restores the signal dispositions Python changed (SIGPIPE) in the worker;
    # close_fds=False: the worker inherits what its agent passed (its park pipes).
    worker = subprocess.Popen(command, close_fds=False).pid
    os.dup2(status_w, STATUS_FD, inheritable=False)
    os.closerange(STATUS_FD + 1, os.sysconf("SC_OPEN_MAX"))  # the worker's fds are its own
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a namespace's init ignores it then
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # wakes the poll below
    poller = select.poll()
    poller.register(STATUS_FD, 0)  # POLLERR once the outer (its reader) is gone
    poller.register(wake_r, select.POLLIN)
    while True:
        while True:  # reap every orphan; the worker's end is the namespace's
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == worker:
                os.write(STATUS_FD, str(status).encode())
                os._exit(0)
        for fd, _events in poller.poll():
            if fd == STATUS_FD:
                os._exit(1)
            os.read(wake_r, 512)


# ------------------------------------------------------------------ the outer
def _forward_to_group(leader: int) -> None:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # ended: its status is on its way
            os.killpg(leader, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)


def wait_and_end(init_pid: int, status_r: int) -> None:
    """Forward signals to the worker, wait for the init, then end as the worker did (as the
    init did, if it died before it could say)."""
    _forward_to_group(init_pid)  # the init leads the worker's group, and ignores them itself
    while True:
        pid, init_status = os.wait()
        if pid == init_pid:
            break  # else an orphan of the restore
    with os.fdopen(status_r, "rb") as pipe:
        reported = pipe.read()
    # No report: the init was killed (by CRIU after a migration's dump, or by a SIGKILL of the
    # whole tree), and the worker with it.
    end_as(int(reported) if reported else init_status)


def end_as(status: int) -> None:
    """Exit as a process with wait status ``status`` did: same code, or same signal."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum != signal.SIGKILL:  # which has no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def launch(command: list[str]) -> None:
    _check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        try:
            init(command, status_w)
        finally:
            os._exit(1)
    os.close(status_w)
    os.closerange(3, status_r)  # the worker's park pipes: its exit must close them
    os.closerange(status_r + 1, os.sysconf("SC_OPEN_MAX"))
    wait_and_end(pid, status_r)


def restore(report_fd: int, status_pipe: str, command: list[str]) -> None:
    _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    status_r, status_w = os.pipe()
    os.set_inheritable(status_w, True)
    pidfile = f"/tmp/torchrelay-restore-{os.getpid()}-{time.time_ns()}.pid"
    command += ["--inherit-fd", f"fd[{status_w}]:{status_pipe}", "--pidfile", pidfile]
    started = time.monotonic()
    # close_fds=False: CRIU needs the fds named by its --inherit-fd options.
    code = subprocess.call(command, close_fds=False)
    seconds = time.monotonic() - started
    os.close(status_w)
    try:
        with open(pidfile) as f:
            root = int(f.read())
        os.unlink(pidfile)
    except (OSError, ValueError):
        root = 0
    with os.fdopen(report_fd, "w") as report:
        if code != 0 or root == 0:
            report.write(json.dumps({"error": code}) + "\n")
            sys.exit(1)
        report.write(json.dumps({"pid": root, "seconds": seconds}) + "\n")
    wait_and_end(root, status_r)


def main() -> None:
    if sys.argv[1] == "launch":
        launch(sys.argv[2:])
    else:
        report_fd = int(sys.argv[2])
        os.set_inheritable(report_fd, False)
        restore(report_fd, sys.argv[3], sys.argv[4:])


if __name__ == "__main__":
    main()
