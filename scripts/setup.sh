#!/usr/bin/env bash
# Prepare this node for gpujitter, idempotently, saying what each step does:
# Debian packages (bcc, kernel headers, venv), the kernel-headers link bcc needs when the
# running kernel has no headers package, tracefs, and a venv (.venv) that sees Debian's bcc
# and holds gpujitter in editable mode. Run as root; safe to re-run.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
venv="$here/.venv"
step() { printf '==> %s\n' "$*"; }
skip() { printf '    %s\n' "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "setup: must run as root (bcc needs it): sudo $0" >&2; exit 1; }

# libjemalloc2, libtcmalloc-minimal4: real allocators for the malloc probe's precise-mode tests
# gcc, libc6-dev: `gpujitter drill` builds its stub libcuda and injection helpers at run time
# prometheus: its promtool checks the shipped alert rules and the daemon's metrics in the
# tests (the server it also brings is not started)
# chromium, fonts-dejavu-core: the tests render `report --html` in a real (headless) browser
packages=(python3-bpfcc python3-venv python3-pip linux-headers-amd64 util-linux
    libjemalloc2 libtcmalloc-minimal4 gcc libc6-dev prometheus chromium fonts-dejavu-core)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    step "Debian packages present: ${packages[*]}"
fi

kernel=$(uname -r)
moddir=/lib/modules/$kernel
if [ -e "$moddir/build/Makefile" ]; then
    step "kernel headers for $kernel: $(readlink -f "$moddir/build")"
else
    # No headers package matches this kernel: bcc only needs headers to compile, and
    # tracepoint layouts come from tracefs at run time, so the newest Debian headers serve.
    build=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
    [ -n "$build" ] || { echo "setup: no /usr/src/linux-headers-*-amd64 after install" >&2; exit 1; }
    common=${build%-amd64}-common
    step "kernel $kernel has no headers package: linking $build (fallback headers)"
    mkdir -p "$moddir"
    ln -sfn "$build" "$moddir/build"
    ln -sfn "$common" "$moddir/source"
fi

if mountpoint -q /sys/kernel/tracing; then
    step "tracefs mounted at /sys/kernel/tracing"
else
    step "mounting tracefs at /sys/kernel/tracing"
    mount -t tracefs tracefs /sys/kernel/tracing
fi

if [ ! -x "$venv/bin/python" ]; then
    step "creating venv $venv (with system site-packages, for Debian's bcc)"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
else
    step "venv present: $venv"
fi

# Reinstall only when the project's metadata changed since the last install.
stamp="$venv/.gpujitter-installed"
want=$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    step "installing gpujitter (editable) and its dependencies into the venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e "$here[dev]"
    echo "$want" > "$stamp"
else
    step "gpujitter installed in the venv (pyproject.toml unchanged)"
fi

"$venv/bin/python" -c 'import bcc' 2>/dev/null \
    || { echo "setup: the venv cannot import bcc (python3-bpfcc)" >&2; exit 1; }
step "ready: $venv/bin/gpujitter"
