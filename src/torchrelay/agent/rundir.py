"""A run directory belongs to one job: claimed exclusively, its secrets created owner-only.

A second job in the same directory would append to the first one's ledger (so ``report`` mixes
two runs) and write its token into a file another user may have prepared (a symlink, a file
with a loose mode). So a directory that already holds a job's files is refused, the ledger is
created exclusively (two launchers racing for one directory: one wins), and the ``token`` and
``endpoint`` files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600.
"""

from __future__ import annotations

import os
from pathlib import Path

LEDGER = "ledger.jsonl"
# Files only a job writes: any of them means the directory holds (or held) a job.
JOB_FILES = (LEDGER, "token", "endpoint")


class RunDirError(ValueError):
    """The run directory cannot be used for this job; the message says why, in one line."""


def claim_run_dir(run_dir: Path) -> Path:
    """Create ``run_dir`` if needed and its ledger file exclusively; return the ledger's path.

    Raises :class:`RunDirError`, touching nothing, if the directory already holds a job (a
    finished or a live one) or cannot be created.
    """
    for name in JOB_FILES:
        if os.path.lexists(run_dir / name):
            raise RunDirError(
                f"--run-dir {run_dir} already holds a job ({name} exists); give a new "
                "directory, so that one ledger describes one run"
            )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        create_exclusive(run_dir / LEDGER, "", mode=0o644)
    except FileExistsError:
        raise RunDirError(f"--run-dir {run_dir} was just claimed by another job") from None
    except OSError as exc:
        raise RunDirError(f"cannot use --run-dir {run_dir}: {exc.strerror or exc}") from None
    return run_dir / LEDGER


def create_exclusive(path: Path, text: str, mode: int = 0o600) -> None:
    """Create ``path`` holding ``text`` with ``mode``; never reuse or follow an existing entry
    (:class:`FileExistsError` for a file, a symlink -- even a dangling one -- or anything)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
