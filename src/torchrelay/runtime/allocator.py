"""glibc's allocator, set for a training process: keep freed memory mapped.

glibc hands freed memory back to the kernel: a block above its mmap threshold at once, the top
of the heap once more than its trim threshold is free. Both thresholds start small and glibc
raises them as large blocks are freed, so how often a step's temporaries (autograd's, the
optimizer's) come back as fresh pages depends on what else the process happened to free. In
the same two processes (``bench.steady_ab``), plain DDP's steps took 0 or 1,255 minor page
faults each depending only on whether the other model's collectives freed 5 MB copies every
step. With both thresholds fixed, every step of either took 0-2.

Fixed thresholds still map and unmap every block over 32 MB (glibc takes no mmap threshold
above that on 64-bit) each time. In a 2-rank DDP job on the CPU, that was 1,451 page faults a
step with 500 MB of model and AdamW state and 1,894 with 1 GB: 0.1 and 0.4 s more of the
kernel's time a step, and steps of up to 1.1 and 1.9 s where the host had taken the freed
memory back in between, as a VM with free page reporting does (bench/analysis.md, "Twentieth
pass"). So a worker keeps large blocks too: no block is mapped on its own (``M_MMAP_MAX`` 0:
all come from the heap) and the heap is never trimmed; a step after the first two then faults
nothing. That is safe only with glibc's per-thread cache off, which the node agent sets
(:mod:`torchrelay.heap`): with it on, the heap could grow by several copies of a large block
before reusing one. Where it is not off, or with ``TORCHRELAY_KEEP_LARGE_BLOCKS=0``, a worker
only fixes the thresholds: the mmap threshold at 32 MB and the trim threshold at 256 MB.

The cost is memory: a process's resident size stays at the most it held at once, which a
training step reaches every iteration anyway, plus what the heap's layout adds (in the jobs
above: the same peak at 500 MB, 11 % more at 1 GB; on batches of changing shape 1-17 % more,
which then stopped growing: ``bench.heap_shapes``). Without glibc (musl, macOS) nothing
changes.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from torchrelay.heap import keeps_large_blocks

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
NEVER_TRIM = -1  # mallopt(3): a trim threshold of -1 disables trimming


def glibc_settings(environ: Mapping[str, str]) -> list[tuple[int, int]]:
    """The ``mallopt`` calls for a process started with ``environ`` (see the module doc)."""
    if keeps_large_blocks(environ):
        return [(M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM)]
    return [(M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)]


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc to keep this process's freed memory (see the module doc); ``False`` where the
    C library has no ``mallopt`` or refused a value. Never raises."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(option, value) == 1 for option, value in glibc_settings(environ))
