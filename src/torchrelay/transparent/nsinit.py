"""Parent of a restored process: ``python nsinit.py REPORT_FD FRESH criu restore -d ...``.

With FRESH = 1 it first enters a new PID and mount namespace (so the snapshot's PIDs, maybe
still in use here, are free) and forks that namespace's init, which mounts its own /proc;
with 0 the same process does the work as a child subreaper. The worker side then runs
``criu restore --restore-detached``; the restored root, orphaned when CRIU exits, is
reparented to it. It writes ONE JSON line to REPORT_FD -- ``{"pid": <restored pid as it sees
itself>, "seconds": <restore time>}`` or ``{"error": <criu's exit status>}`` -- and stays as the
restored process's parent: it forwards SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to it and
reaps every orphan.

This process ends as the restored one did: the same exit status, or killed by the same signal
(a namespace's init cannot kill itself, so there the outer process does it), so its agent sees
the copy's exit as it would see any worker's. It dies with its own parent (the agent's
parent-death trampoline binds it); the namespace's init dies with it, and every restored
process with that init.

Run by path with ``-I -S``: it imports only the standard library.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what} failed")


def _forward_to(pid: int) -> None:
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, _frame: os.kill(pid, signum))


def restore_and_wait(report_fd: int, command: list[str]) -> int:
    """Restore, report, then wait for the restored root: its wait status (0 on failure: 1)."""
    _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    pidfile = f"/tmp/torchrelay-restore-{os.getpid()}-{time.time_ns()}.pid"
    started = time.monotonic()
    # close_fds=False: CRIU needs the fds named by its --inherit-fd options.
    code = subprocess.call([*command, "--pidfile", pidfile], close_fds=False)
    seconds = time.monotonic() - started
    try:
        with open(pidfile) as f:
            root = int(f.read())
        os.unlink(pidfile)
    except (OSError, ValueError):
        root = 0
    with os.fdopen(report_fd, "w") as report:
        if code != 0 or root == 0:
            report.write(json.dumps({"error": code}) + "\n")
            return 1 << 8
        report.write(json.dumps({"pid": root, "seconds": seconds}) + "\n")
    _forward_to(root)
    while True:
        pid, status = os.wait()
        if pid == root:
            return status


def end_as(status: int) -> None:
    """Exit as a process with wait status ``status`` did: same code, or same signal."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main() -> None:
    report_fd, fresh, command = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
    os.set_inheritable(report_fd, False)
    if not fresh:
        end_as(restore_and_wait(report_fd, command))
    _check(libc.unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare(CLONE_NEWPID | CLONE_NEWNS)")
    status_r, status_w = os.pipe()
    init = os.fork()
    if init == 0:  # PID 1 of the new namespace
        os.close(status_r)
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount(/, private)")
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        _check(libc.mount(b"proc", b"/proc", b"proc", flags, None), "mount(/proc)")
        status = restore_and_wait(report_fd, command)
        os.write(status_w, str(status).encode())
        os._exit(0)
    os.close(report_fd)
    os.close(status_w)
    _forward_to(init)  # the init forwards them on to the restored root
    os.waitpid(init, 0)
    with os.fdopen(status_r) as status:
        end_as(int(status.read() or 1 << 8))


if __name__ == "__main__":
    main()
