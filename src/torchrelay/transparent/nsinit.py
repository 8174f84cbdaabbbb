"""Parent of a restored process: ``python nsinit.py REPORT_FD criu restore -d ...``.

It runs ``criu restore --restore-detached``; the restored root, orphaned when CRIU exits, is
reparented to this process (the init of a fresh PID namespace, or a child subreaper outside
one). It then writes ONE JSON line to REPORT_FD -- ``{"pid": <restored pid as it sees itself>,
"seconds": <restore time>}`` or ``{"error": <criu's exit status>}`` -- and stays as the restored
process's parent: it forwards SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to it, reaps every
orphan, and exits with its exit status (128 + N for a death by signal N). It dies with its
own parent (the agent's parent-death trampoline binds it); in a PID namespace every restored
process dies with it.

Run by path with ``-I -S``: it imports only the standard library.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def main() -> int:
    report_fd, command = int(sys.argv[1]), sys.argv[2:]
    os.set_inheritable(report_fd, False)
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
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
            return 1
        report.write(json.dumps({"pid": root, "seconds": seconds}) + "\n")
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, _frame: os.kill(root, signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1  # the restored root was never our child: should not happen
        if pid == root:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main())
