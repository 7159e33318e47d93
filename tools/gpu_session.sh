#!/usr/bin/env bash
# One batched session on a GPU node (as root): sets up bcc and gpujitter from a copy of the
# tree, then runs what only a real GPU can answer, each step with its own time limit, and
# leaves the results in $OUT. Steps (pick with arguments; default: all):
#   info         GPU, driver, kernel, libcuda, `gpujitter gpus` (+ its NVML recording)
#   entrypoints  which libcuda entry points PyTorch reaches (tools/cuda_entrypoints.py)
#   proof        the injected-stall proof (bench/gpu_proof.py) + its trace and NVML recording
#   cost         the cuda probe's cost (bench/cuda_cost.py)
#   cli          `gpujitter gaps --json` live beside a workload with stalls
#   profiler     a PyTorch profiler trace + a recording of the same run (bench/profiler_trace.py)
#   drills       every `gpujitter drill` scenario with the PyTorch loop (bench/drills_gpu.sh;
#                not in the default set: it takes most of a run call by itself)
#   realjob      `gpujitter run` beside a real training job: restarts, false gaps, the
#                injected scenarios scored (bench/real_job_gpu.sh accuracy; a run call of its own)
#   realjob-cost the training job's step time with and without the daemon, its CPU and memory
#                (bench/real_job_gpu.sh cost; a run call of its own)
#   faulthooks   the fault loop bare, with the faults probe watching it and not, and with empty
#                programs on its per-fault hooks (bench/faults.py; FAULT_HOOKS_ROUNDS, default 16);
#                minor-fault time sampled from the kernel's counters against the probe's
#                (bench/fault_sampling.py)
#   schedcstate  sched and cstate alone on the two ping-pongs and a feeder, hooks toggled on one
#                loaded set, and their in-kernel time (bench/sched_cstate.py; SCHED_CSTATE_REPS,
#                default 9)
#   daemoncpu    the daemon's CPU by thread beside the training job (bench/daemon_cpu.py;
#                DAEMON_CPU_SETTLE=S: the windows open S s after READY (default 90: past
#                the engine's 60 s retention, steady running; the bench's 420 s limit fits
#                ROUNDS x trees x (S + SECONDS + 15));
#                DAEMON_CPU_BEFORE=DIR: rounds alternate with the package tree in DIR, e.g.
#                a `git archive` of an earlier commit; DAEMON_CPU_PROFILE=0: no profiled
#                round after them; DAEMON_CPU_RECORD=yes|alternate: the daemon also
#                records (off in its defaults), in every round or every other; a run call
#                of its own)
#   probethread  the probe thread's calls (poll, tick, each probe's sample), timed, beside the
#                training job (bench/probe_thread.py; PROBE_THREAD_SECONDS, default 30;
#                PROBE_THREAD_BEFORE=DIR: rounds alternate with the package tree in DIR,
#                PROBE_THREAD_ROUNDS=N of each, default 2)
#   startstop    `gpujitter run` from exec to READY and from SIGTERM/SIGINT to exit, its memory,
#                every uprobe gone after the stop (bench/startstop.py, the node's libcuda;
#                STARTSTOP_MAPS=1: also its memory by mapping at the peak, --maps;
#                STARTSTOP_BEFORE=DIR: rounds alternate with the package tree in DIR;
#                STARTSTOP_ROUNDS=N, default 5 a tree; STARTSTOP_COLD=1: the page cache
#                dropped before each start, --cold)
#   rssgrowth    the daemon's resident memory over its first minutes beside the training job,
#                and the mappings that grew (bench/rss_growth.py; RSS_GROWTH_SECONDS, default 150)
#   nvmlcalls    what one NVML read costs, per way of calling it, and the sampler's reads at
#                their cadences, beside the training job (bench/nvml_calls.py)
#   nvmlmemory   NVML's memory and CPU in a fresh process, step by step (bench/nvml_memory.py)
#   clockstep    what NVML's sample stamps do when the wall clock is stepped back and on
#                (bench/nvml_clock_step.py; it steps this node's clock and puts it back)
#   phases       where that start goes: wall, CPU and peak memory by phase (bench/start_phases.py)
#   defaultset   the default set's cost on the C microbenchmarks (ping-pong, faults, alloc,
#                steady) and in the kernel per sched event (bench/default_set.py;
#                DEFAULT_SET_ROUNDS=N, default 6; DEFAULT_SET_ARGS: more of its options;
#                DEFAULT_SET_TAG: default_set-TAG.json; DEFAULT_SET_BEFORE=DIR: the bench
#                also runs with the package tree in DIR, the trees in turns,
#                DEFAULT_SET_TURNS=N times each (default 1), into default_set-TAG-{this,
#                before}-TURN.json; a run call of its own)
# Usage: tools/gpu_session.sh TREE BCC_TARBALL [STEP...]   (TREE: a copy of the repository
# holding .whl/ with an orjson wheel for the node's python3; BCC_TARBALL "-": no bcc, for
# steps that load no probe (nvmlcalls, nvmlmemory): one run call without the bundle, which
# with the tree is more than a call may carry)
set -uo pipefail
tree=$(cd "$1" && pwd)
bundle=$2
shift 2
steps=${*:-info entrypoints proof cost cli}
out=${OUT:-/tmp/gpujitter-out}
mkdir -p "$out" /tmp/gj
log() { printf '==> %s\n' "$*"; }

log "setup: bcc bundle, orjson, gpujitter link tree"
if [ "$bundle" != - ]; then
    mkdir -p /opt/bcc && tar -C /opt/bcc -xJf "$bundle" && eval "$(/opt/bcc/activate-bcc)"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$tree"/.whl/*.whl
rm -rf /tmp/pkg && mkdir -p /tmp/pkg/gpujitter
for f in "$tree"/gpujitter/*; do ln -s "$f" /tmp/pkg/gpujitter/; done
for part in probes daemon tui; do ln -s "$tree/$part" "/tmp/pkg/gpujitter/$part"; done
export PYTHONPATH=/tmp/pkg:/tmp/site:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1

# A package tree at /tmp/pkg-before made of the tree in $1 (e.g. a `git archive` of an
# earlier commit), laid out as /tmp/pkg is: for a bench's rounds that alternate with it.
before_pkg() {
    rm -rf /tmp/pkg-before && mkdir -p /tmp/pkg-before/gpujitter
    for f in "$1"/gpujitter/*; do ln -s "$f" /tmp/pkg-before/gpujitter/; done
    for part in probes daemon tui; do ln -s "$1/$part" "/tmp/pkg-before/gpujitter/$part"; done
}

# bench/train_job.py in the background, watched by what follows: sets $pid once it is ready
# (its stdin held open: end of input is the job's quit).
start_train_job() {
    local job=$1
    mkdir -p "$job"
    PYTHONPATH=$PYTHONPATH:$tree timeout 560 python3 -P -m bench.train_job --out "$job" \
        --target-step-ms 50 < <(sleep 600) > "$job/job.jsonl" 2> "$job/job.err" &
    for _ in $(seq 240); do grep -q '"ready"' "$job/job.jsonl" 2>/dev/null && break; sleep 1; done
    pid=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["ready"]["pid"])' "$job/job.jsonl")
}

for step in $steps; do
    case $step in
    info)
        log "info"
        nvidia-smi -L; uname -r; nproc
        # what a probe's dispatch costs depends on them (docs/performance.md, "The hook floor")
        lscpu | grep -E 'Model name|Thread|Hypervisor'
        grep -H . /sys/devices/system/cpu/vulnerabilities/{spectre_v2,retbleed,spec_rstack_overflow}
        cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null
        python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
        ldconfig -p | grep -i libcuda; ls -la /usr/local/nvidia/lib64/libcuda.so* 2>/dev/null
        timeout 60 python3 -P -m gpujitter gpus
        timeout 60 python3 -P -m gpujitter gpus --json --nvml-record /tmp/gj/gpus-nvml.jsonl > /tmp/gj/gpus.json
        cat /tmp/gj/gpus.json
        ;;
    entrypoints)
        log "entrypoints"
        BCC_PROBE_LIMIT=5000 timeout 120 python3 "$tree/tools/cuda_entrypoints.py" --json "$out/entrypoints.json"
        ;;
    proof)
        log "proof"
        timeout 150 python3 "$tree/bench/gpu_proof.py" --out /tmp/gj/proof
        cp /tmp/gj/proof/events.ndjson /tmp/gj/proof/truth.json /tmp/gj/proof/nvml.jsonl "$out/"
        cp /tmp/gj/proof/table.md /tmp/gj/proof/gaps.json /tmp/gj/
        ;;
    cost)
        log "cost"
        timeout 170 python3 "$tree/bench/cuda_cost.py" --json "$out/cost.json"
        ;;
    cli)
        log "cli: gpujitter gaps --json beside a workload with stalls"
        rm -f /tmp/gj/cli-events.ndjson  # a second run: --save-events makes a new file
        timeout 45 python3 -P -m gpujitter gaps --json --duration 25s --min-gap 5ms \
            --save-events /tmp/gj/cli-events.ndjson --nvml-record /tmp/gj/cli-nvml.jsonl \
            > /tmp/gj/cli-gaps.ndjson &
        gaps_pid=$!
        sleep 4
        script='[["clean",500],["stall","sleep50"],["clean",500],["idle",300],["clean",500],["stall","cpu20"],["clean",500]]'
        printf 'script %s\nquit\n' "$script" | timeout 60 python3 "$tree/bench/gpu_workload.py" > /tmp/gj/cli-truth.json
        wait $gaps_pid
        cat /tmp/gj/cli-gaps.ndjson /tmp/gj/cli-truth.json
        python3 -P -m gpujitter gaps --replay-events /tmp/gj/cli-events.ndjson --json > /tmp/gj/cli-replay.ndjson
        cmp <(grep gpu.gap /tmp/gj/cli-gaps.ndjson) /tmp/gj/cli-replay.ndjson && echo "cli replay identical"
        ;;
    profiler)
        log "profiler: a PyTorch profiler trace and a recording of the same run (export --merge)"
        timeout 150 python3 "$tree/bench/profiler_trace.py" /tmp/gj/profiler
        tar -C /tmp/gj -czf "$out/profiler.tar.gz" profiler
        ;;
    drills)
        log "drills: every scenario, PyTorch loop"
        OUT=$out "$tree/bench/drills_gpu.sh"
        ;;
    realjob)
        log "realjob: gpujitter run beside a real training job, restarted; scenarios scored"
        OUT=$out "$tree/bench/real_job_gpu.sh" accuracy
        ;;
    startstop)
        log "startstop: gpujitter run ready and stop times, memory, uprobes left"
        before=()
        if [ -n "${STARTSTOP_BEFORE:-}" ]; then
            before_pkg "$STARTSTOP_BEFORE"
            before=(--before /tmp/pkg-before)
        fi
        timeout 500 python3 "$tree/bench/startstop.py" --rounds "${STARTSTOP_ROUNDS:-5}" --nvml \
            --libcuda system ${STARTSTOP_MAPS:+--maps} ${STARTSTOP_COLD:+--cold} "${before[@]}" \
            --out "$out/startstop.json"
        ;;
    rssgrowth)
        log "rssgrowth: the daemon's resident memory after READY beside the training job"
        start_train_job /tmp/gj/rssgrowth
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 400 python3 -P -m bench.rss_growth \
            --pid "$pid" --seconds "${RSS_GROWTH_SECONDS:-150}" --json > "$out/rss_growth.json")
        kill -INT "$pid"; sleep 5
        ;;
    nvmlcalls)
        log "nvmlcalls: NVML reads' cost by way of calling, and the sampler's beside the job"
        start_train_job /tmp/gj/nvmlcalls  # the process lists the sampler meets: the job's
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 150 python3 -P -m bench.nvml_calls \
            --json > "$out/nvml_calls.json")
        kill -INT "$pid"; sleep 5
        ;;
    nvmlmemory)
        log "nvmlmemory: NVML's memory in a fresh process, step by step"
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 60 python3 -P -m bench.nvml_memory \
            > "$out/nvml-memory.log")
        ;;
    clockstep)
        log "clockstep: NVML's sample stamps across a stepped wall clock"
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 60 python3 -P -m bench.nvml_clock_step \
            > "$out/nvml-clock-step.json")
        ;;
    phases)
        log "phases: gpujitter run's start by phase"
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 200 python3 -P -m bench.start_phases \
            --rounds 3 --nvml --json > "$out/phases.json")
        ;;
    defaultset)
        log "defaultset: the default set on the C microbenchmarks, interleaved rounds"
        # the fault loop's fault count per mapping depends on it
        echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
        name="$out/default_set${DEFAULT_SET_TAG:+-$DEFAULT_SET_TAG}"
        if [ -z "${DEFAULT_SET_BEFORE:-}" ]; then
            # shellcheck disable=SC2086  # DEFAULT_SET_ARGS: words, e.g. --unwatched --workloads faults
            (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 500 python3 -P -m bench.default_set \
                --rounds "${DEFAULT_SET_ROUNDS:-6}" ${DEFAULT_SET_ARGS:-} --json > "$name.json")
        else
            before_pkg "$DEFAULT_SET_BEFORE"
            for turn in $(seq "${DEFAULT_SET_TURNS:-1}"); do
                for which in before this; do
                    path=$PYTHONPATH  # /tmp/pkg first, bcc's and orjson's after it
                    [ "$which" = before ] && path=/tmp/pkg-before:${PYTHONPATH#/tmp/pkg:}
                    log "defaultset: $which, turn $turn"
                    # shellcheck disable=SC2086
                    (cd /tmp && PYTHONPATH=$path:$tree timeout 500 python3 -P \
                        -m bench.default_set --rounds "${DEFAULT_SET_ROUNDS:-6}" \
                        ${DEFAULT_SET_ARGS:-} --json > "$name-$which-$turn.json")
                done
            done
        fi
        ;;
    faulthooks)
        log "faulthooks: the fault loop bare, with the faults probe and with empty programs"
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 400 python3 -P -m bench.faults \
            --rounds "${FAULT_HOOKS_ROUNDS:-16}" --loops 8 --json > "$out/faults.json")
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 200 python3 -P -m bench.fault_sampling \
            --runs 3 --json > "$out/fault_sampling.json")
        ;;
    schedcstate)
        log "schedcstate: sched and cstate on the ping-pongs and a feeder, hooks toggled"
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 500 python3 -P -m bench.sched_cstate \
            --reps "${SCHED_CSTATE_REPS:-9}" --json > "$out/sched_cstate.json")
        ;;
    daemoncpu)
        log "daemoncpu: the daemon's CPU by thread beside the training job"
        start_train_job /tmp/gj/daemoncpu
        before=()
        if [ -n "${DAEMON_CPU_BEFORE:-}" ]; then
            before_pkg "$DAEMON_CPU_BEFORE"
            before=(--before /tmp/pkg-before)
        fi
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 420 python3 -P -m bench.daemon_cpu live \
            --pid "$pid" --seconds "${DAEMON_CPU_SECONDS:-40}" --rounds "${DAEMON_CPU_ROUNDS:-2}" \
            --settle "${DAEMON_CPU_SETTLE:-90}" --record "${DAEMON_CPU_RECORD:-no}" "${before[@]}" \
            --json > "$out/daemoncpu.json")
        # py-spy's samples and the run's recording come back (to replay the main thread here)
        if [ "${DAEMON_CPU_PROFILE:-1}" != 0 ]; then
            mkdir -p "$out/prof"
            (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout $((100 + ${DAEMON_CPU_SETTLE:-90})) \
                python3 -P -m bench.daemon_cpu live --pid "$pid" --seconds 30 \
                --settle "${DAEMON_CPU_SETTLE:-90}" --profile "$out/prof" --json \
                > "$out/profiled.json")
        fi
        for rec in "$out"/prof/rec-*/; do
            [ -d "$rec" ] && tar -C "$rec" -cJf "${rec%/}.tar.xz" . && rm -rf "$rec"
        done
        kill -INT "$pid"; sleep 5
        ;;
    probethread)
        log "probethread: the probe thread's calls, timed, beside the training job"
        start_train_job /tmp/gj/probethread
        rounds=()
        if [ -n "${PROBE_THREAD_BEFORE:-}" ]; then
            before_pkg "$PROBE_THREAD_BEFORE"
            rounds=(--rounds "${PROBE_THREAD_ROUNDS:-2}" --before /tmp/pkg-before)
        fi
        (cd /tmp && PYTHONPATH=$PYTHONPATH:$tree timeout 480 python3 -P -m bench.probe_thread \
            --pid "$pid" --seconds "${PROBE_THREAD_SECONDS:-30}" --settle 20 "${rounds[@]}" \
            --json > "$out/probe_thread.json")
        kill -INT "$pid"; sleep 5
        ;;
    realjob-cost)
        log "realjob-cost: the training job with and without the daemon"
        OUT=$out "$tree/bench/real_job_gpu.sh" cost
        ;;
    esac
done
tar -C /tmp/gj -czf "$out/extra.tar.gz" --exclude proof --exclude profiler .
ls -la "$out"
