"""mlp_train.py, except that the first state schema read in the job is garbage: as if someone
who reached the store had overwritten the key just before the receiver read it."""

import os
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

real_get = dist.TCPStore.get


def forged_once(store: dist.TCPStore, key: str) -> bytes:
    value = real_get(store, key)
    if not key.endswith("/schema"):
        return value
    marker = Path(os.environ["TORCHRELAY_RUN_DIR"]) / "forged"
    try:  # once per job, whichever process reads a schema first
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return value
    return b"garbage"


dist.TCPStore.get = forged_once
sys.argv[0] = str(Path(__file__).with_name("mlp_train.py"))
runpy.run_path(sys.argv[0], run_name="__main__")
