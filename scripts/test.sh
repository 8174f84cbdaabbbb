#!/usr/bin/env bash
# Set up (first time only), then run the whole test suite, multi-process chaos tests included.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast part.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests examples bench
# The slowest tests are listed at the end: where CI's time goes, run by run.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
