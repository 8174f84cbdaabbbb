"""The exit holder: a killed worker is seen before the kernel has unmapped its memory.

Why: the kernel ends a killed process in a fixed order. It unmaps its memory, then closes its
files (its sockets: that is how its peers' collectives fail), then tells its parent
(``waitpid``, a pidfd: that is how its node agent reports it). The unmapping takes ~70 ms per
GiB resident, and ~20 ms for a process that has only imported torch (``bench.exit_floor``);
nobody can learn of the death before it is done, so it sat under every detection.

What it does: :func:`start` clones one more process from the worker, sharing its address
space (``CLONE_VM``; not a thread, so not killed with it). While it lives, the worker's exit
only drops a reference to the memory: its sockets close and its parent reaps it at once. The
holder keeps no descriptor of the worker's but a pidfd of it, and blocks every signal; it
exits when the pidfd says the worker has exited, and the kernel unmaps the memory in its exit,
off the recovery's path, at nice 19 (on a machine without a spare core it takes idle CPU, not
the recovery's).

Contract:

- opt-in, ``TORCHRELAY_EXIT_HOLDER=1``. It was on by default for CPU workers for a session of
  soaking (docs/benchmarks.md, "Seventh pass"): a killed worker's connections then close
  ~1 ms after the kill instead of 20-40 ms, so what it had sent but not yet delivered is
  lost more often, and survivors fall a step behind their peers more often (a plan has
  fewer sources; a laggard keeps its own state through the transfer where a copy fits, see
  :mod:`torchrelay.transfer.buffers`), and gloo's stuck sends are more frequent; it stays
  off until that costs nothing. On CUDA devices it is not yet checked against the driver on a GPU
  (``scripts/gpu_check.sh`` does): the driver's mappings would live on in the holder;
- one holder per process, started by :func:`torchrelay.init`; it is named
  ``torchrelay-hold`` (``ps -o comm``) and is a child of the worker, in its process group;
- it never outlives the worker by more than its unmapping: it exits on the worker's end, and
  the agent SIGKILLs the worker's process group once the worker has ended;
- an ordinary exit (the interpreter's, which runs ``atexit``) ends and reaps the holder
  first: nobody waits on that death, so the worker unmaps its own memory at its own priority,
  as without a holder, and no orphan is left for init to reap (the holder's nice 19 made a
  job's end wait for the unmapping of every worker: ~1.5 s more per job here);
- not started (``None``) without the switch, without the compiled extension (:mod:`native`),
  and in transparent mode (CRIU cannot snapshot two processes that share memory);
- failure: a holder that cannot start (Linux < 5.9 has no ``close_range``, < 5.3 no pidfd) is
  one line on stderr, and the worker runs without it; nothing else changes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys

from torchrelay.runtime import native

SWITCH = "TORCHRELAY_EXIT_HOLDER"  # "1": start it (see the module doc)

_holder: int | None = None


def start() -> int | None:
    """Start this process's holder unless it has one or must not (module doc); its pid."""
    global _holder
    if _holder is not None:
        return _holder
    if os.environ.get(SWITCH, "") != "1":
        return None
    extension = native.load()
    if extension is None:
        return None
    pid = extension.start_exit_holder()
    if pid < 0:
        print(
            f"torchrelay: no exit holder ({os.strerror(-pid)}): this worker's death will be "
            f"seen only once the kernel has unmapped its memory",
            file=sys.stderr,
        )
        return None
    _holder = pid
    atexit.register(_stop, pid, os.getpid())
    return pid


def _stop(holder: int, owner: int) -> None:
    """End and reap the holder at an ordinary exit (module doc); a SIGKILL, as it blocks every
    other signal. Its end drops a reference to the memory it shares: nothing is unmapped."""
    if os.getpid() != owner:  # a forked child (a data loader worker) runs the handlers too
        return
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
