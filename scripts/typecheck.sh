#!/usr/bin/env bash
# mypy over the installed package layout: gpujitter.probes lives in probes/ (and so on), which
# mypy cannot map by itself, so a tree of links under build/typecheck gives it the real names.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tree="$here/build/typecheck"
rm -rf "$tree"
mkdir -p "$tree/gpujitter"
for f in "$here"/gpujitter/*; do ln -s "$f" "$tree/gpujitter/"; done
for part in probes daemon tui; do ln -s "$here/$part" "$tree/gpujitter/$part"; done
cd "$tree"
exec "$here/.venv/bin/mypy" --cache-dir "$here/.mypy_cache" -p gpujitter
