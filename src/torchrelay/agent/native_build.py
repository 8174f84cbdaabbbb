"""The launcher's half of the runtime's compiled extension (the step guard's completion and the
exit holder): build it before a node starts its workers.

Workers only load what is built (:mod:`torchrelay.runtime.native`); this module builds
it, once per source, torch and Python, in a child process started like every job process
(:func:`spawn`: it dies with the launcher). Behaviour:

- built already, or ``TORCHRELAY_NATIVE=0``: nothing, not even ``import torch``;
- otherwise one line says so, a line every ``PROGRESS_EVERY_S`` while the compiler runs, and
  one when it is done. The compiler's output goes to a log beside the build;
- a build that fails (no compiler, no headers, a compiler error) is one line, and the job runs
  without it: the Python step guard, no exit holder. The failure is remembered next to the
  build so that later launches do not pay for it again; deleting that directory tries again.
  A build that runs past ``BUILD_TIMEOUT_S``, or is interrupted, is stopped whole and not
  remembered.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from torchrelay.agent.spawn import signal_group, spawn
from torchrelay.progress import Emit, to_stderr
from torchrelay.runtime import native

PROGRESS_EVERY_S = 10.0
BUILD_TIMEOUT_S = 600.0
FAILED = "build-failed"
FALLBACK = (
    "workers run the Python step guard (2-4 % more CPU a step on small models) and no exit "
    "holder (a killed worker is seen only once its memory is unmapped)"
)


def ensure_native(emit: Emit = to_stderr) -> bool:
    """Build the extension unless it is built or switched off; whether it is there now."""
    path = native.built_path() if native.enabled() else None
    if path is None or path.is_file():
        return path is not None
    failed = path.with_name(FAILED)
    if failed.is_file():
        reason = failed.read_text().strip()
        emit(f"torchrelay: {reason}; {FALLBACK} (delete {path.parent} to retry)")
        return False
    native.make_private_dirs(path)
    log = path.with_name(f"build-{socket.gethostname()}-{os.getpid()}.log")
    emit(f"torchrelay: compiling torchrelay's C++, once for this torch (log: {log})")
    started = time.monotonic()
    status = _run_build(log, started, emit)
    if status == 0 and path.is_file():
        emit(f"torchrelay: C++ compiled in {time.monotonic() - started:.0f} s")
        return True
    if status is None:
        emit(f"torchrelay: compiling the C++ took over {BUILD_TIMEOUT_S:.0f} s; {FALLBACK}")
        return False
    reason = _last_line(log) or f"the build exited with status {status}"
    failed.write_text(reason + "\n")
    emit(f"torchrelay: {reason}; {FALLBACK} (log: {log})")
    return False


def _run_build(log: Path, started: float, emit: Emit) -> int | None:
    """The build's exit status, or ``None`` if it ran past :data:`BUILD_TIMEOUT_S`."""
    package_root = str(Path(native.__file__).parents[2])
    path = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    with log.open("wb") as out:
        child = spawn(
            [sys.executable, "-m", "torchrelay.runtime.native"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            while True:
                try:
                    return child.wait(timeout=PROGRESS_EVERY_S)
                except subprocess.TimeoutExpired:
                    waited = time.monotonic() - started
                    if waited > BUILD_TIMEOUT_S:
                        return None
                    emit(f"torchrelay: still compiling torchrelay's C++ ({waited:.0f} s)")
        finally:
            if child.poll() is None:  # interrupted or timed out: the compiler goes too
                signal_group(child.pid, signal.SIGKILL)
                child.wait()


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def main() -> int:
    """``python -m torchrelay.agent.native_build``: what a launch does first (scripts/setup.sh
    runs it so that the demo and the tests start with the extension built)."""
    return 0 if ensure_native() else 1


if __name__ == "__main__":
    sys.exit(main())
