"""How well minor-fault time could be told without a program on every fault (issue 12's
route: the kernel's per-task counters read where a program runs anyway), against the faults
probe as it is and against the workload's own clock: three fault patterns, each timed by
the workload itself (its first-touch loops), by the faults probe (FaultStats minor_ns), and by
a sampler that reads the thread's min_flt and context-switch counts at each scheduler tick
and each switch-out.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.fault_sampling [--runs 2]
        [--cost-ns 1800] [--json]

Patterns (one thread on CPU 1, 4 KiB pages, transparent huge pages off for its maps):
`storm`, 3 x 200 MiB touched back to back; `mixed`, 60 x (2.2 MiB touched, 3 ms of
computing); `short`, 20 x (4.4 MiB touched, a 20 ms sleep). The sampler's estimates: `tick
storm`, every tick interval with faults at most 20 us apart on average and no switch counts
whole (the probe's storm rule at tick resolution); `n x cost`, each interval between two
samples counts its faults times --cost-ns (at most the interval), at ticks and switch-outs.
The sampler is this bench's own program: a sketch for the measurement, not the probe.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

WORKLOAD = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
static volatile unsigned long sink;
static void compute(long long ns) { long long end = now() + ns;
    while (now() < end) for (int i = 0; i < 100; i++) sink += i; }
int main(int argc, char **argv) {   /* argv: pattern, repetitions; prints fault ns */
    const char *mode = argv[1]; int reps = atoi(argv[2]); char c;
    if (read(0, &c, 1) != 1) return 1;
    long long fault_ns = 0;
    size_t pages = !strcmp(mode, "storm") ? 51200 : !strcmp(mode, "mixed") ? 550 : 1100;
    for (int r = 0; r < reps; r++) {
        char *p = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(p, pages * 4096, MADV_NOHUGEPAGE);
        long long t0 = now();
        for (size_t i = 0; i < pages; i++) p[i * 4096] = 1;
        fault_ns += now() - t0;
        munmap(p, pages * 4096);
        if (!strcmp(mode, "mixed")) compute(3000000);
        else if (!strcmp(mode, "short")) { struct timespec w = {0, 20000000}; nanosleep(&w, 0); }
    }
    printf("%lld\n", fault_ns);
    return 0;
}
"""
PATTERNS = {"storm": 3, "mixed": 60, "short": 20}

# Per thread of the target process: the counters at the last sample, and the estimates.
SAMPLER = r"""
struct sampled {
    u64 last_ns, last_minflt, last_switches;
    u64 storm_ns, n_cost_ns, faults;
};
BPF_HASH(threads, u32, struct sampled, 1024);

static __always_inline void sample(bool tick)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TARGET)
        return;
    u64 task = (u64)bpf_get_current_task();
    unsigned long minflt = 0, nv = 0, niv = 0;
    bpf_probe_read_kernel(&minflt, sizeof(minflt), (void *)(task + TASK_MIN_FLT));
    bpf_probe_read_kernel(&nv, sizeof(nv), (void *)(task + TASK_NVCSW));
    bpf_probe_read_kernel(&niv, sizeof(niv), (void *)(task + TASK_NIVCSW));
    u64 now = bpf_ktime_get_ns(), switches = nv + niv;
    u32 tid = id;
    struct sampled zero = {};
    struct sampled *s = threads.lookup_or_try_init(&tid, &zero);
    if (!s)
        return;
    if (s->last_ns) {
        u64 n = minflt - s->last_minflt, span = now - s->last_ns, cost = n * COST_NS;
        s->faults += n;
        s->n_cost_ns += cost < span ? cost : span;
        /* a switch-out counts its own switch already (the count goes up before the trace) */
        if (tick && n && switches == s->last_switches && span <= n * 20000)
            s->storm_ns += span;
    }
    s->last_ns = now;
    s->last_minflt = minflt;
    s->last_switches = switches;
}

RAW_TRACEPOINT_PROBE(local_timer_entry) { sample(true); return 0; }
RAW_TRACEPOINT_PROBE(sched_switch) { sample(false); return 0; }
"""


def run(binary: Path, pattern: str, cost_ns: int) -> dict[str, Any]:
    from bcc import BPF

    from gpujitter.probes.btf import offset_cflags
    from gpujitter.probes.events import Event, FaultStats
    from gpujitter.probes.runner import ProbeSet
    from gpujitter.probes.topology import load_topology
    from gpujitter.probes.watch import WatchSpec

    proc = subprocess.Popen([str(binary), pattern, str(PATTERNS[pattern])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {1}))  # fmt: skip
    offsets = offset_cflags("TASK", "task_struct", ("min_flt", "nvcsw", "nivcsw"))
    sampler = BPF(text=SAMPLER, cflags=[*offsets, f"-DTARGET={proc.pid}", f"-DCOST_NS={cost_ns}"])
    events: list[Event] = []
    try:
        watch = WatchSpec(comms=[binary.name])
        topology = load_topology()
        with ProbeSet(["faults"], topology=topology, watch=watch, emit=events.append) as probes:
            probes.start()
            probes.core.refresh(time.monotonic_ns())
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("g")
            proc.stdin.close()
            while proc.poll() is None:
                probes.poll()
                time.sleep(0.05)
            probes.poll()
            probes.tick(time.monotonic_ns())
        truth_ns = int(proc.stdout.read())
        sampled = next(iter(sampler["threads"].values()), None)
    finally:
        sampler.cleanup()
    ms = 1e-6
    return {
        "pattern": pattern,
        "workload_ms": truth_ns * ms,
        "faults_probe_ms": sum(e.minor_ns for e in events if isinstance(e, FaultStats)) * ms,
        "tick_storm_ms": sampled.storm_ns * ms if sampled else 0.0,
        "n_cost_ms": sampled.n_cost_ns * ms if sampled else 0.0,
        "faults_sampled": sampled.faults if sampled else 0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="runs of each pattern (default 2)")
    p.add_argument("--cost-ns", type=int, default=1800,
                   help="one minor fault's cost for the n x cost estimate (default 1800: "
                   "the development VM's fault loop)")  # fmt: skip
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.runs < 1 or args.cost_ns < 1:
        p.error("--runs and --cost-ns must be at least 1")
    os.sched_setaffinity(0, {0})
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / "gjs-faults.c", Path(tmp) / "gjs-faults"
        src.write_text(WORKLOAD)
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(src)], check=True)
        for pattern in PATTERNS:
            for _ in range(args.runs):
                results.append(run(binary, pattern, args.cost_ns))
                if not args.json:
                    r = results[-1]
                    print(f"{r['pattern']:6} workload {r['workload_ms']:7.1f} ms  faults probe "
                          f"{r['faults_probe_ms']:7.1f}  tick storm {r['tick_storm_ms']:7.1f}  "
                          f"n x cost {r['n_cost_ms']:7.1f}", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps({"cost_ns": args.cost_ns, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
