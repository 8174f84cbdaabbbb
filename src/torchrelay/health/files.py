"""Owner-only JSON files in a job's run directory: written atomically, read only if trusted.

The health injection files and the quarantine list are acted on (a device is migrated off,
or handed out again), so they are authenticated the way the run directory's ``token`` is: by
the file system. :func:`write_atomic` creates a temporary file exclusively (``O_EXCL |
O_NOFOLLOW``, mode 0600) next to the target and renames it over the target, so a reader sees
the old file or the new one, never half of one. :func:`read_owned` reads a file only if it is
a regular file (not a symlink) owned by this user and closed to group and others; otherwise
it raises :class:`UntrustedFile` with one line saying why.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from torchrelay.agent.rundir import create_exclusive


class UntrustedFile(ValueError):
    """A file that is not this user's alone, or not a regular file; the message says why."""


def write_atomic(path: Path, plain: Any) -> None:
    """Replace ``path`` by ``plain`` as JSON, owner-only, in one rename (creating the parent
    directory, owner-only, if needed)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        create_exclusive(temporary, json.dumps(plain, indent=1) + "\n", mode=0o600)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def read_owned(path: Path) -> str:
    """The text of ``path``; :class:`FileNotFoundError` if there is none, :class:`UntrustedFile`
    if it is not this user's regular, owner-only file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedFile(f"{path} is a symlink") from None
        raise
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFile(f"{path} is not a regular file")
        if info.st_uid != os.getuid():
            raise UntrustedFile(f"{path} belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            raise UntrustedFile(f"{path} is open to others (mode {info.st_mode & 0o777:o})")
        return file.read()
