#!/usr/bin/env bash
# gpujitter beside a real training job (bench/train_job.py) on a GPU node, as root, through
# bench/real_job.py: MODE accuracy (the daemon started under the running job and restarted,
# false gaps counted after each attach, a clean stretch, the injected scenarios scored) or
# cost (the job's step time with and without the daemon, its CPU and memory). Each within a
# wall budget (REALJOB_BUDGET_S, default 520 s: a run call allows 570 s, of which the
# session's set-up takes ~20 s and the packing below ~10 s). Writes $OUT/realjob-MODE.json
# as it goes (the summary: what a cut-short run still returns), then the work folder (job
# records, step times, daemon logs and stderr, table.md) as $OUT/realjob-MODE.tar.gz and
# the daemon's traces as $OUT/realjob-MODE-traces.tar.gz (not sent back past 40 MiB).
# Run through tools/gpu_session.sh, which sets up bcc and the package:
#   tools/gpu_session.sh . .gpu/bcc.tar.xz realjob         (or realjob-cost)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tree=$(dirname "$here")
mode=${1:?usage: real_job_gpu.sh accuracy|cost [bench/real_job.py options]}
shift
out=${OUT:-/tmp/gpujitter-out}
budget_s=${REALJOB_BUDGET_S:-520}
work=/tmp/gj-realjob-$mode  # not under /tmp/gj, which gpu_session.sh sends back whole
rm -rf "$work" && mkdir -p "$work" "$out"
# The drills' C parts (the injections), built on the development machine for a node
# without gcc (python -m gpujitter.daemon.drill.build .gpu/drill-cache).
if [ -d "$tree/.gpu/drill-cache" ]; then export GPUJITTER_CACHE=$tree/.gpu/drill-cache; fi
export PYTHONPATH=${PYTHONPATH:-}:$tree  # bench.*, after the package's link tree
start=$(date +%s)
cd /tmp  # a checkout in the working folder must not shadow the package
# REALJOB_ARGS: more bench/real_job.py options (e.g. "--attaches 4 --stalls 4"), as words
# shellcheck disable=SC2086
timeout -s INT -k 30 $((budget_s + 30)) python3 -P -m bench.real_job "$mode" --out "$work" \
    --summary "$out/realjob-$mode.json" --budget-s "$budget_s" "$@" ${REALJOB_ARGS:-}
echo "==> real job ($mode): exit $? after $(($(date +%s) - start))s"
python3 -P -m bench.real_job_table "$out/realjob-$mode.json" | tee "$work/table.md"
tar -C "$work" -czf "$out/realjob-$mode.tar.gz" --exclude traces .
tar -C "$work" -czf "/tmp/realjob-$mode-traces.tar.gz" traces
size=$(stat -c %s "/tmp/realjob-$mode-traces.tar.gz")
if ((size <= 40 << 20)); then
    mv "/tmp/realjob-$mode-traces.tar.gz" "$out/"
else
    echo "==> traces: $size bytes, over 40 MiB: left on the node"
fi
echo "==> real job ($mode): packed after $(($(date +%s) - start))s"
