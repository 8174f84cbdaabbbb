"""CRIU, the process snapshot tool under transparent mode: finding it, dumping, restoring.

:func:`find_criu` looks, in order, at ``$TORCHRELAY_CRIU``, the one ``scripts/setup_criu.sh``
built (``.venv/criu/criu``: this interpreter's prefix, then the checkout's), and ``criu`` on
PATH, and takes the first that is >= 4.1 and passes ``criu check`` (Debian 12's 3.17 fails on
kernels >= 6.13). None: :class:`CriuUnavailable`, one line saying what is missing and to run
``scripts/setup_criu.sh``. The answer is cached for the process.

:func:`dump` snapshots a process tree into an images directory: the worker must hold no socket
and no io_uring (the hook closes them before it parks; there is no ``--tcp-established``), and
``--shell-job`` is added for a process that does not lead its session. A job process's tree is
dumped from its PID namespace's init (:mod:`nsinit`). :func:`restore` brings such a snapshot
back to life in a fresh PID namespace under a new :mod:`nsinit` outer, so the snapshot's PIDs
never clash with living ones and the copy can be dumped again, reattaching the snapshot's
outside pipes to the caller's fds (``--inherit-fd``). Each returns typed stats; each failure is a
:class:`CriuError`: one line with CRIU's first error and the path of its log (kept).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from torchrelay.agent.spawn import spawn
from torchrelay.transparent import nsinit

MIN_VERSION = (4, 1)
ENV = "TORCHRELAY_CRIU"
NSINIT = Path(nsinit.__file__)
_SETUP = "run scripts/setup_criu.sh (it builds CRIU 4.1.1 into .venv/criu) or set TORCHRELAY_CRIU"
_META = "torchrelay-snapshot.json"


class CriuUnavailable(RuntimeError):
    """No usable CRIU on this machine; the message says what is missing and how to get one."""


class CriuError(RuntimeError):
    """A dump or restore failed; the message is one line naming CRIU's log (kept)."""

    def __init__(self, message: str, log: Path) -> None:
        super().__init__(message)
        self.log = log


class DumpFailed(CriuError):
    """``criu dump`` failed: CRIU resumed the process tree as it was."""


class RestoreFailed(CriuError):
    """``criu restore`` failed: nothing of the snapshot runs."""


@dataclass(frozen=True)
class Criu:
    path: str
    version: str


@dataclass(frozen=True)
class DumpStats:
    images_dir: Path
    bytes: int
    seconds: float
    log: Path


@dataclass
class Restored:
    """A restored process tree: ``process`` is its :mod:`nsinit` outer (its exit status is the
    restored worker's; signal it like any job process), ``pid`` the restored worker as this
    process sees it, ``seconds`` CRIU's restore time."""

    process: subprocess.Popen[bytes]
    pid: int
    seconds: float
    log: Path


def _candidates() -> list[str]:
    found = [os.environ.get(ENV, "")]
    for root in (Path(sys.prefix), Path(__file__).resolve().parents[3] / ".venv"):
        found.append(str(root / "criu" / "criu"))
    found.append(shutil.which("criu") or "")
    return list(dict.fromkeys(path for path in found if path))


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str] | str:
    """``command``'s outcome, or why it did not run to its end (one line)."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except OSError as exc:
        return f"{command[0]}: {exc.strerror}"
    except subprocess.TimeoutExpired:
        return f"{command[0]} {command[1]}: no answer in {timeout:g} s"


def _probe(path: str) -> Criu | str:
    """A usable CRIU at ``path``, or why it is not one."""
    out = _run([path, "--version"], 30)
    if isinstance(out, str):
        return out
    match = re.search(r"Version:\s*(\d+)\.(\d+)(\S*)", out.stdout)
    if match is None:
        return f"{path}: not CRIU (no version)"
    version = f"{match[1]}.{match[2]}{match[3]}"
    if (int(match[1]), int(match[2])) < MIN_VERSION:
        return f"{path} is CRIU {version}, older than {MIN_VERSION[0]}.{MIN_VERSION[1]}"
    check = _run([path, "check"], 60)
    if isinstance(check, str):
        return check
    if check.returncode != 0:
        lines = (check.stderr or check.stdout).strip().splitlines()
        return f"{path}: 'criu check' failed ({lines[-1] if lines else 'no output'})"
    return Criu(path, version)


@cache
def find_criu() -> Criu:
    """The CRIU to use (see the module docstring); :class:`CriuUnavailable` if none works."""
    if os.geteuid() != 0:
        raise CriuUnavailable(
            "transparent mode needs root (CRIU dumps and restores processes); run as root"
        )
    reasons = []
    for path in _candidates():
        probed = _probe(path)
        if isinstance(probed, Criu):
            return probed
        reasons.append(probed)
    why = "; ".join(reasons) if reasons else "no criu found"
    raise CriuUnavailable(f"transparent mode needs CRIU >= 4.1 ({why}): {_SETUP}")


def dump(pid: int, images_dir: Path, *, leave_running: bool, criu: Criu | None = None) -> DumpStats:
    """Snapshot the process tree rooted at ``pid`` into ``images_dir`` (created).

    ``leave_running``: the tree goes on (a clone's donor); otherwise CRIU kills it once dumped
    (a migration). The log is ``images_dir``'s sibling ``<name>.dump.log``.
    """
    criu = criu or find_criu()
    images_dir.mkdir(parents=True, exist_ok=True)
    log = images_dir.with_name(images_dir.name + ".dump.log")
    shell_job = os.getsid(pid) != pid
    command = [criu.path, "dump", "-t", str(pid), "-D", str(images_dir), "-o", str(log)]
    command += ["--leave-running"] * leave_running + ["--shell-job"] * shell_job
    started = time.monotonic()
    done = _run(command, 600)  # killed on timeout: the tree, no longer traced, runs on
    seconds = time.monotonic() - started
    if isinstance(done, str) or done.returncode != 0:
        why = done if isinstance(done, str) else _first_error(log)
        raise DumpFailed(f"criu dump of pid {pid} failed: {why}; log: {log}", log)
    (images_dir / _META).write_text(json.dumps({"shell_job": shell_job, "pid": pid}))
    return DumpStats(images_dir, images_bytes(images_dir), seconds, log)


def images_bytes(images_dir: Path) -> int:
    """Bytes of a snapshot's image files."""
    return sum(f.stat().st_size for f in images_dir.iterdir() if f.is_file())


def restore(
    images_dir: Path,
    *,
    inherit_fds: Mapping[str, int],
    status_pipe: str,
    criu: Criu | None = None,
    timeout: float = 300.0,
    **popen: Any,
) -> Restored:
    """Restore the snapshot in ``images_dir`` as a job process (bound to die with this one).

    The snapshot is a job process's tree (:func:`nsinit.tree`: a PID namespace's init and its
    worker), dumped from its init; CRIU restores it in a fresh PID namespace, so its PIDs may
    still be in use here (a clone). ``inherit_fds`` maps CRIU's name of an outside resource the
    snapshot held (``pipe:[123]``, see :func:`fd_names`) to the fd that replaces it: an fd of
    this process, passed on under the same number, or 1/2 with ``stdout``/``stderr`` in
    ``popen``. ``status_pipe`` names the init's status pipe (:attr:`nsinit.Tree.status_pipe`),
    which the new :mod:`nsinit` replaces with its own.
    """
    criu = criu or find_criu()
    meta = json.loads((images_dir / _META).read_text())
    log = images_dir.with_name(images_dir.name + ".restore.log")
    command = [criu.path, "restore", "-D", str(images_dir), "-o", str(log), "-d"]
    command += ["--shell-job"] * bool(meta["shell_job"])
    for name, fd in inherit_fds.items():
        command += ["--inherit-fd", f"fd[{fd}]:{name}"]
    report_r, report_w = os.pipe()
    wrapper = [sys.executable, "-I", "-S", str(NSINIT), "restore", str(report_w), status_pipe]
    passed = sorted({fd for fd in inherit_fds.values() if fd > 2} | {report_w})
    try:
        process = spawn([*wrapper, *command], pass_fds=passed, stdin=subprocess.DEVNULL, **popen)
    finally:
        os.close(report_w)
    with os.fdopen(report_r, "rb") as report:
        # One line, or EOF if the wrapper died first; nothing within ``timeout``: CRIU hangs.
        ready, _, _ = select.select([report], [], [], timeout)
        line = report.readline() if ready else b""
    try:
        outcome = json.loads(line) if line else {"error": "no report"}
    except ValueError:
        outcome = {"error": "unreadable report"}
    if "error" in outcome:
        process.kill()  # the restored init, and all in its namespace, die with it
        process.wait()
        why = _first_error(log) if ready else f"no answer in {timeout:g} s"
        raise RestoreFailed(f"criu restore of {images_dir} failed: {why}; log: {log}", log)
    worker = nsinit.only_child(int(outcome["pid"]))
    if worker is None:
        process.wait()
        raise RestoreFailed(f"the process restored from {images_dir} died at once", log)
    return Restored(process, worker, float(outcome["seconds"]), log)


def fd_names(pid: int, fds: list[int]) -> dict[int, str]:
    """CRIU's names (``pipe:[inode]``, ...) of the given fds of process ``pid``."""
    return {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}


def _first_error(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no log written"
    # CRIU logs "Error (file:line): ..."; the RLIMIT_NOFILE one is harmless without
    # CAP_SYS_RESOURCE and comes first on every run.
    errors = [line for line in lines if "Error" in line and "RLIMIT_NOFILE" not in line]
    return (errors[0] if errors else lines[-1] if lines else "empty log").strip()
