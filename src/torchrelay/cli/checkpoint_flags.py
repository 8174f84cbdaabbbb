"""``torchrelay run``'s checkpoint flags: ``--checkpoint-every`` parsed and checked with
``--checkpoint-dir`` and ``--resume``, the manifests' key handed to the job's processes, and the
checkpoint ``--resume`` goes on from. Each refusal is one line and a non-zero exit."""

from __future__ import annotations

import argparse
import os
import sys

from torchrelay.checkpoints import (
    KEY_ENV,
    CheckpointError,
    Choice,
    Every,
    complete_steps,
    job_key,
    parse_every,
)
from torchrelay.config import JobConfig


def export_key(config: JobConfig, resume: bool) -> None:
    """Put the key that signs the manifests in the environment the job's processes inherit,
    where it exists already: several nodes (derived from the shared secret), or ``--resume``
    (kept in the run directory). A fresh one-node job makes its key once it owns its run
    directory (the launcher)."""
    if config.checkpoint_dir is None or not (resume or config.nnodes > 1):
        return
    try:
        os.environ[KEY_ENV] = job_key(config.run_dir, config.nnodes, create=False)
    except CheckpointError as exc:
        if complete_steps(config.checkpoint_dir):  # else: "no complete checkpoint" says more
            raise SystemExit(f"torchrelay run: {exc}") from None


def checkpoint_every(args: argparse.Namespace, run_dir_given: bool) -> Every | None:
    """``--checkpoint-every`` parsed; the checkpoint flags checked together; else one line."""
    if (args.checkpoint_dir is None) != (args.checkpoint_every is None):
        raise SystemExit("torchrelay run: --checkpoint-dir and --checkpoint-every go together")
    if args.resume and (args.checkpoint_dir is None or not run_dir_given):
        raise SystemExit(
            "torchrelay run: --resume needs the job's --run-dir and --checkpoint-dir (the same "
            "command as before, plus --resume)"
        )
    if args.checkpoint_every is None:
        return None
    try:
        return parse_every(args.checkpoint_every)
    except CheckpointError as exc:
        raise SystemExit(f"torchrelay run: {exc}") from None


def choose_resume(config: JobConfig) -> Choice:
    """``--resume``: the newest verified checkpoint; newer refused ones in one line each."""
    from torchrelay.agent.resume import choose_for_resume

    assert config.checkpoint_dir is not None
    try:
        choice = choose_for_resume(config.checkpoint_dir, config.world_size)
    except CheckpointError as exc:
        raise SystemExit(f"torchrelay run: {exc}") from None
    for line in choice.skipped:
        print(f"torchrelay: checkpoint {line}", file=sys.stderr, flush=True)
    print(f"torchrelay: resuming from {choice.directory}", file=sys.stderr, flush=True)
    return choice
