"""Exit statuses a worker uses to tell the controller why it left, and :func:`leave`. Those in
:data:`SELF_FENCED` say it left on purpose, not by a fault of its own: the controller neither
counts them against ``--max-restarts`` nor mistakes them for a bug in the script."""

import contextlib
import os
from typing import NoReturn

EXIT_FENCED = 70
"""The controller refused this process (a stale generation), or its lease ran out."""

EXIT_CONTROLLER_LOST = 75
"""The controller is gone (its connection closed); the job cannot continue."""

EXIT_COMMUNICATOR_STUCK = 71
"""A collective of an aborted generation did not end after its connections were cut: it might
still write into this process's buffers, so the process leaves and is replaced like a failed
one (not in :data:`SELF_FENCED`, as it did leave of its own accord), but not counted
against ``--max-restarts`` nor taken for a bug in the script (the failure kind
``communicator``): it follows another loss, in gloo (README, Limits)."""

SELF_FENCED = frozenset({EXIT_FENCED, EXIT_CONTROLLER_LOST})


def leave(status: int, why: str) -> NoReturn:
    """Say ``why`` on stderr if it can, and end this process now with ``status``.

    Never raises: when the launcher is gone, so is the reader of our stderr pipe, and a
    ``print`` would raise BrokenPipeError and kill the calling thread instead of the process.
    """
    with contextlib.suppress(OSError):
        os.write(2, f"torchrelay: {why}\n".encode(errors="replace"))
    os._exit(status)
