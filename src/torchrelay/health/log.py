"""Where the health sources say what went wrong: one line each, on stderr by default.

Every source and the poller take a ``log`` callable instead, so that tests can count the
lines (a source that fails says so once, not once per poll).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

Log = Callable[[str], None]


def log_stderr(line: str) -> None:
    print(f"torchrelay health: {line}", file=sys.stderr, flush=True)
