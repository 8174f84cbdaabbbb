"""glibc's allocator, set for a training process: keep freed memory mapped.

glibc hands freed memory back to the kernel: a block above its mmap threshold at once, the top
of the heap once more than its trim threshold is free. Both thresholds start small and glibc
raises them as large blocks are freed, so how often a step's temporaries (autograd's, the
optimizer's) come back as fresh pages depends on what else the process happened to free. In
the same two processes (``bench.steady_ab``), plain DDP's steps took 0 or 1,255 minor page
faults each depending only on whether the other model's collectives freed 5 MB copies every
step. With both thresholds fixed, every step of either took 0-2.

So every torchrelay worker fixes them at start: the mmap threshold at glibc's own upper bound
(32 MB on 64-bit, what its dynamic threshold grows to) and the trim threshold at 256 MB. The
cost is memory: a process keeps up to 256 MB of freed heap mapped instead of returning it.
Tensors over 32 MB are still mapped and unmapped each time. Without glibc (musl, macOS)
nothing changes.
"""

from __future__ import annotations

import ctypes

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (see the module doc); ``False``
    where the C library has no ``mallopt`` or refused a value. Never raises."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_set = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return mmap_set and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
