#!/usr/bin/env bash
# Install the daemon from this checkout, idempotently, saying what each step does: the
# venv's command as /usr/local/bin/gpujitter (a link into this checkout's .venv, so an
# upgrade is `git pull && make install`), the systemd unit, the example configuration (only
# when there is none: an operator's file is never overwritten) and the operations guide.
# DESTDIR=/some/dir stages everything under that root instead (the tests do); systemd is told
# only when it runs this machine and nothing is staged. `scripts/install.sh --uninstall`
# removes the command, the unit and the guide, and keeps configuration, logs and state.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
dest=${DESTDIR:-}
step() { printf '==> %s\n' "$*"; }
skip() { printf '    %s\n' "$*"; }

command=$dest/usr/local/bin/gpujitter
unit=$dest/etc/systemd/system/gpujitter.service
config=$dest/etc/gpujitter/gpujitter.toml
guide=$dest/usr/local/share/doc/gpujitter/operations.md

reload_systemd() {
    if [ -z "$dest" ] && [ -d /run/systemd/system ]; then
        step "systemctl daemon-reload"
        systemctl daemon-reload
    else
        skip "systemd does not run this machine (or DESTDIR is set): no daemon-reload"
    fi
}

if [ "${1:-}" = "--uninstall" ]; then
    if [ -z "$dest" ] && [ -d /run/systemd/system ]; then
        systemctl disable --now gpujitter.service 2>/dev/null || true
    fi
    step "removing $command, $unit, $guide (configuration, logs and state stay)"
    rm -f "$command" "$unit" "$guide"
    reload_systemd
    exit 0
fi

# The daemon runs as root from this checkout: anyone who can write to it can run code as
# root, so refuse a checkout that is not root's alone.
for path in "$here" "$here/.venv" "$here/.venv/bin/gpujitter"; do
    [ -e "$path" ] || { echo "install: $path missing: run make setup first" >&2; exit 1; }
    read -r owner perms < <(stat -L -c '%u %a' "$path")
    if [ "$owner" != 0 ] || [ $((8#$perms & 8#022)) -ne 0 ]; then
        echo "install: $path must be owned by root and writable by root only" >&2
        exit 1
    fi
done

# The unit's filesystem is read-only to the daemon (ProtectSystem=strict): Python cannot
# write the checkout's .pyc files there, and a start that compiles ~80 modules from source
# costs ~0.4 CPU-s more (docs/performance.md, "Start and stop"). The venv's packages were
# byte-compiled by pip as it installed them; the checkout is installed editable.
step "bytecode: the gpujitter, probes, daemon and tui packages"
"$here/.venv/bin/python" -m compileall -q "$here/gpujitter" "$here/probes" "$here/daemon" \
    "$here/tui"

step "command: $command -> $here/.venv/bin/gpujitter"
install -d -m 0755 "$(dirname "$command")"
ln -sfn "$here/.venv/bin/gpujitter" "$command"

step "unit: $unit"
install -D -m 0644 "$here/systemd/gpujitter.service" "$unit"

if [ -e "$config" ]; then
    skip "configuration $config exists: kept (the example is $here/systemd/gpujitter.toml)"
else
    step "configuration: $config (every setting at its default)"
    install -D -m 0644 "$here/systemd/gpujitter.toml" "$config"
fi

step "guide: $guide"
install -D -m 0644 "$here/docs/operations.md" "$guide"

reload_systemd
step "installed; start with: systemctl enable --now gpujitter"
