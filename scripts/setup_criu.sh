#!/usr/bin/env bash
# Provide a CRIU >= 4.1 for transparent mode (process snapshots). Called by scripts/setup.sh.
#
# Uses, in this order: $TORCHRELAY_CRIU, the one this script built (.venv/criu/criu), `criu` on
# PATH -- the first that is >= 4.1 and passes `criu check`. Otherwise (as root, with apt) it
# builds one from the CRIU 4.1.1 source tarball that Debian's archive distributes for trixie,
# checked against the SHA-256 that trixie's signed source index (and criu_4.1.1-1.dsc) give for
# it, and installs it as .venv/criu/criu, which src/torchrelay/transparent/criu.py finds by
# itself. Why not Debian's own package: bookworm's criu 3.17 fails on kernels >= 6.13 (vDSO
# layout), and trixie's binary package needs glibc 2.38.
#
# Quiet on success; one line on stderr and exit 1 on failure (transparent mode then refuses
# to run with a one-line error, and its tests skip outside CI).
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.1.1
sha256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
url=http://deb.debian.org/debian/pool/main/c/criu/criu_${version}.orig.tar.xz
dest=.venv/criu
# What CRIU's `make criu` needs: protobuf-c and protobuf's descriptor.proto for its images,
# libnl/libnet for network state, libnftables for the network lock, libcap, libbsd, libaio, uuid.
build_deps=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
    libnl-3-dev libnet1-dev libcap-dev libbsd-dev uuid-dev libnftables-dev libaio-dev)

fail() { echo "setup_criu: $*" >&2; exit 1; }

# usable CRIU: prints nothing, succeeds when CRIU is >= 4.1 and `criu check` passes.
usable() {
    local v
    [ -x "$1" ] || return 1
    v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *//p')
    [ -n "$v" ] || return 1
    printf '%s\n4.1\n' "$v" | sort -C -V -r || return 1
    "$1" check >/dev/null 2>&1
}

for candidate in "${TORCHRELAY_CRIU:-}" "$dest/criu" "$(command -v criu || true)"; do
    [ -n "$candidate" ] && usable "$candidate" && exit 0
done

[ "$(id -u)" = 0 ] || fail "no CRIU >= 4.1 found and not root: build needs apt-get and root"
command -v apt-get >/dev/null || fail "no CRIU >= 4.1 found and no apt-get to build one"
missing=()
for pkg in "${build_deps[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 \
            && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } \
        || fail "could not apt-get install CRIU's build dependencies: ${missing[*]}"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$work/build.log
curl -fsS -m 300 -o "$work/criu.tar.xz" "$url" || fail "could not download $url"
echo "$sha256  $work/criu.tar.xz" | sha256sum -c --status \
    || fail "criu_${version}.orig.tar.xz does not match its SHA-256 from Debian's .dsc; not built"
tar -C "$work" -xJf "$work/criu.tar.xz"
# WERROR=0: newer compilers' warnings must not stop a release build.
if ! nice -n 10 make -C "$work/criu-$version" -j"$(nproc)" WERROR=0 criu >"$log" 2>&1; then
    mkdir -p "$dest" && cp "$log" "$dest/build.log"
    fail "building CRIU $version failed; see $dest/build.log"
fi
mkdir -p "$dest"
install -m 0755 "$work/criu-$version/criu/criu" "$dest/criu"
usable "$dest/criu" || fail "the built $dest/criu does not pass 'criu check' on this kernel"
