#!/usr/bin/env bash
# Set up (first time only), then run the whole test suite, multi-process chaos tests included.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast part.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests examples bench
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
