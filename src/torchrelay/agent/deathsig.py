"""Trampoline: ``python deathsig.py LAUNCHER_PID COMMAND...`` becomes COMMAND, bound to die
with its launcher.

It asks Linux to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``), makes sure
the parent did not die before that request (then nobody would send the signal), and execs
COMMAND in place: same pid, and the setting survives ``execve``. A worker, a spare, a
SIGSTOPped process (SIGKILL works on it too) -- none can outlive a launcher killed with
SIGKILL, which gets no chance to clean up.

Run by path with ``-I -S``, it imports nothing but the standard library: it must not add the
launch time of torch (or of torchrelay) to each process it starts.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def bind_to_parent(parent: int) -> None:
    """Be SIGKILLed when ``parent`` (this process's parent) dies; if it already died, die now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        # The parent died between our fork and the prctl: do what the signal would have done.
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    launcher, command = int(sys.argv[1]), sys.argv[2:]
    bind_to_parent(launcher)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
