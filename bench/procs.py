"""Child processes that are always cleaned up, the environment they start with, free ports,
bounded waits.

Every launcher the benchmark starts (torchrun, torchrelay, the torchft lighthouse and replica
groups) goes through :class:`ProcessSet`: each child is its own session leader, so leaving the
``with`` block (normally, on an exception, or on Ctrl-C) SIGKILLs the child's whole process
group, grandchildren (torchrun's workers) included, and reaps it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

from torchrelay.heap import heap_environment

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).resolve().parent / "workers"
BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the OS picked it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def environment(settings: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``settings`` while the block runs, as it was afterwards."""
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def worker_env(**extra: str) -> dict[str, str]:
    """The environment every child gets: one intra-op thread (2 cores, 2+ processes), glibc's
    tunables as torchrelay's node agent sets them (:mod:`torchrelay.heap`), and this
    checkout's ``src`` first on the path (``$BENCH_SRC`` instead, to measure another tree),
    then the caller's ``$PYTHONPATH``."""
    env = dict(os.environ)
    src = os.environ.get("BENCH_SRC") or str(REPO_ROOT / "src")
    # After ours, the caller's path: where it keeps packages of its own (scripts/gpu_check.sh).
    path = [src, str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(path),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    # As torchrelay's node agent starts its workers, so that every system compared runs on
    # the same allocator (``TORCHRELAY_HUGEPAGES=0``: all on 4 KiB pages). Only the processes that
    # call runtime.allocator.keep_freed_memory (torchrelay's workers, both sides of
    # bench.steady_ab) then keep their large freed blocks.
    env.update(heap_environment(env))
    return env


def resident_mib(pid: int) -> float:
    """Process ``pid``'s resident size now (``VmRSS``), in MiB; NaN for a process that has
    none (a zombie)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _descendants(root: int) -> list[int]:
    """Pids of every live descendant of ``root`` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class ProcessSet:
    """Starts children and guarantees they are all dead when the ``with`` block ends."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        cmd: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Starts ``cmd`` in its own session, stdout+stderr appended to ``log``."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(cmd),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or worker_env(),
                cwd=cwd or REPO_ROOT,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def kill_all(self) -> None:
        """SIGKILLs every child, its process group and all its descendants, then reaps.

        Descendants are listed first and killed by pid: torchrun starts each worker in a
        session of its own, so killing torchrun's process group would orphan them.
        """
        for proc in self._procs:
            for pid in [*_descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._procs.clear()

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill_all()


def wait_exit(proc: subprocess.Popen[bytes], deadline: float) -> int:
    """Waits for ``proc`` until the monotonic ``deadline``; raises ``TimeoutError`` after it."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"{proc.args!r} still running at its deadline") from exc


def wait_listening(port: int, deadline: float) -> None:
    """Returns once something accepts TCP connections on 127.0.0.1:``port``."""
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on port {port}") from None
            time.sleep(0.02)  # a server in another process: polling its port is the event
