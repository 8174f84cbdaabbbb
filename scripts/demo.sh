#!/usr/bin/env bash
# Set up (first time only), then run the demo: a 4-worker GPT job on CPU that loses two workers
# to SIGKILL, recovers them from live replicas, and is compared bit for bit with a clean run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/torchrelay demo "$@"
