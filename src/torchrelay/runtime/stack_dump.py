"""The worker's side of :mod:`torchrelay.stack_dump`: every thread's stack, on request.

Contract: after :func:`register`, :data:`~torchrelay.stack_dump.SIGNAL` writes the stack of
every thread of this process to stderr (faulthandler's format), then the end line
:data:`~torchrelay.stack_dump.END`. Where the compiled extension does not load, nothing is
registered and the signal is not caught: the node agent sees that and fences at once, without
waiting for a dump that cannot come. A handler that user code installs for the signal later
replaces this one.
"""

from __future__ import annotations

import faulthandler
import sys

from torchrelay.runtime import native
from torchrelay.stack_dump import END, SIGNAL


def register() -> bool:
    """Dump this process's stacks on :data:`SIGNAL` from now on; ``False``: not possible here
    (no compiled extension)."""
    extension = native.load()
    if extension is None or extension.install_stack_dump_end(SIGNAL, END) != 0:
        return False
    # chain: after the dump, faulthandler calls the handler installed above (the end line).
    faulthandler.register(SIGNAL, file=sys.__stderr__, all_threads=True, chain=True)
    return True
