#!/usr/bin/env bash
# The drill scenarios (DRILLS, default the classic ten) with the real PyTorch loop, on a GPU
# node, as root: each under its own time limit (SIGINT first, so that the drill restores what
# it changed), all within a budget; writes $OUT/drills/SCENARIO.json (`gpujitter drill
# --json`: the score), SCENARIO.log (its progress) and SCENARIO.gjtrace (its events, for
# `gpujitter report`),
# then the accuracy table of docs/accuracy.md (table.md); all of it also as drills.tar.gz.
# Run through tools/gpu_session.sh's `drills` step, which sets up bcc and the package:
#   tools/gpu_session.sh . .gpu/bcc.tar.xz drills
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gpujitter-out}/drills
budget_s=${DRILL_BUDGET_S:-390}  # no scenario starts after this (the run call allows 8 min)
mkdir -p "$out"
# The drills' C parts, built on the development machine (python -m gpujitter.daemon.drill.build
# .gpu/drill-cache) for a node without gcc; with gcc they are built there as needed.
if [ -d "$here/../.gpu/drill-cache" ]; then export GPUJITTER_CACHE=$here/../.gpu/drill-cache; fi
start=$(date +%s)
cd /tmp  # a checkout in the working folder must not shadow the package
injected="--duration 12s --stalls 8 --stall-ms 25"
# DRILLS: the scenarios to run (words), e.g. DRILLS="gc gil pyhot"; clean runs 60 s
scenarios=${DRILLS:-clean swap faults filefaults malloc compute contention migrate irq cstate}
for name in $scenarios; do
    spec="$name $injected"
    [ "$name" = clean ] && spec="clean --duration 60s"
    if (($(date +%s) - start > budget_s)); then
        echo "==> $name: skipped (budget of ${budget_s}s spent)"
        continue
    fi
    limit=$([ "$name" = clean ] && echo 110 || echo 60)
    # shellcheck disable=SC2086  # $spec is words
    timeout -s INT -k 15 "$limit" python3 -P -m gpujitter drill $spec --backend torch --json \
        --keep-trace "$out/$name.gjtrace" \
        >"$out/$name.json" 2>"$out/$name.log"
    echo "==> $name: exit $? after $(($(date +%s) - start))s"
    tail -n 2 "$out/$name.log"
done
python3 "$here/drill_table.py" "$out"/*.json | tee "$out/table.md"
tar -C "$out" -czf "$out/../drills.tar.gz" .
