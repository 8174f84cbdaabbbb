"""What ``torchrelay run --transparent`` changes in a launch: plain functions over the config.

The workers get :data:`SITE_DIR` (a ``sitecustomize`` that installs :mod:`hook`) first on their
``PYTHONPATH``, and ``USE_LIBUV=0``: the c10d TCPStore then uses no io_uring, which a process
snapshot (CRIU) cannot dump; and each runs under :mod:`nsinit`, in a PID namespace of its
own, so that CRIU can dump it (and any copy of it) with that namespace's init. The options the
mode cannot honour are refused before anything starts, with one line (:func:`refusal`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from torchrelay.config import JobConfig
from torchrelay.transparent import nsinit

SITE_DIR = Path(__file__).resolve().parent / "site"


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a transparent-mode worker starts with, on top of ``environ``'s."""
    path = [str(SITE_DIR), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "PYTHONPATH": os.pathsep.join(path),
        "USE_LIBUV": "0",
        "TORCHRELAY_TRANSPARENT": "1",
    }


def worker_command(command: list[str]) -> list[str]:
    """``command`` started as a transparent-mode worker: under an :mod:`nsinit` outer (the
    process its agent supervises), as the child of its own PID namespace's init."""
    return [sys.executable, "-I", "-S", nsinit.__file__, "launch", *command]


def refusal(config: JobConfig, resume: bool) -> str | None:
    """Why ``config`` cannot run in transparent mode (one line), or None."""
    if config.spares:
        return (
            "--transparent keeps no spare: a dead worker is rebuilt by cloning a live replica "
            "into a fresh process (use --spares 0)"
        )
    if config.checkpoint_dir is not None or resume:
        return (
            "--transparent cannot take --checkpoint-dir or --resume: durable checkpoints save "
            "the state tracked by the model-aware API, which a transparent script has none of"
        )
    if config.elastic or config.pool is not None:
        return (
            "--transparent cannot take --elastic or --pool: a shrunk job runs a lost rank's "
            "micro-batches through the model-aware API, which a transparent script does not call"
        )
    return None
