#!/usr/bin/env bash
# Create .venv and install torchrelay with its dev tools. Idempotent: re-installs only when
# pyproject.toml changed. torch is pinned to the 2.13.0 CPU build for development and CI (the
# package itself asks for torch>=2.6); an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($python --version)"
    "$python" -m venv .venv
fi
stamp=.venv/.torchrelay-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing torch 2.13.0 (CPU) and torchrelay[dev,bench] into .venv (about a minute)"
    .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,bench]"
    echo "$want" > "$stamp"
fi
# apt_install "TOOLS" WHY PACKAGE...: as root with apt, install PACKAGEs when a TOOL is missing.
# Elsewhere the tests that need them are skipped (and fail under CI=true, which must provide them).
apt_install() {
    local tools=$1 why=$2 tool missing=""
    shift 2
    for tool in $tools; do command -v "$tool" >/dev/null || missing=1; done
    if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing $* (apt) for $why"
        apt-get install -y -qq "$@" >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "$@" >/dev/null 2>&1; } \
            || echo "setup: could not install $*; $why will not run" >&2
    fi
}
# The network-partition test cuts a node's link with nftables inside a network namespace: it
# needs root, iproute2 and nft.
apt_install nft "the network-partition test" nftables
# The state-store and election tests start a real etcd (Debian's etcd-server, 3.4) on free
# loopback ports.
apt_install etcd "the state-store tests" etcd-server
# The Slurm tests run their own cluster (munged, slurmctld, a slurmd per node) as root.
apt_install "munged slurmctld slurmd sbatch srun" "the Slurm tests" slurm-wlm munge
# The HTML report test opens the page in headless Chromium (Debian's chromium) and keeps its
# screenshot.
apt_install chromium "the HTML report rendering test" chromium
# The runtime's C++ (src/torchrelay/runtime/native.cpp: the step guard's completion and the exit
# holder), compiled once per torch into ~/.cache/torchrelay (about 40 s): what a launch does
# first anyway. Without a compiler the launcher says so in one line and workers run without it.
apt_install g++ "the runtime's C++" g++
.venv/bin/python -m torchrelay.agent.native_build || true
# Transparent mode snapshots processes with CRIU >= 4.1 (Debian 12's 3.17 fails on this kernel):
# found, or built once into .venv/criu/criu (about a minute). Without it transparent mode
# refuses with one line and its tests skip (and fail under CI=true, which must provide it).
bash scripts/setup_criu.sh || true
