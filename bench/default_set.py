"""The default probe set as a whole (issues 3 and 12, "Cost"): start-up time and CPU, resident
memory after start and at the peak, and, in one run, five workloads with and without the
probes attached — a context-switch heavy pipe ping-pong, a page-fault heavy loop, two
allocation heavy loops and a steady feeding-like loop — as slowdown ratios, with the
probes' in-kernel time per program run (kernel.bpf_stats_enabled), per scheduler event for a
watched and an unwatched ping-pong (beside an empty program's), and the events delivered to
Python per second.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.default_set [--rounds 5]
        [--probes LIST] [--workloads LIST] [--unwatched] [--hook-floor] [--min-seconds S]
        [--warm-up SHARE] [--json]

In each round every workload runs without and with the probes back to back (the set is
started, timed, between the two runs, and stopped after the second; which run comes first
alternates by round), so that drift on a shared machine hits both alike; figures are the
medians over rounds of each round's ratio, with the rounds' spread, for the workload's own
clock and for its CPU time (the process's user and system time: it leaves out what the host
ran elsewhere on that CPU, which a VM's wall clock does not; the probes' runs in the
workload's context are in it, those in interrupts are not; on the H100 hosts of 2026-12-05
it spread as the clock did). The workloads are watched (by
command name), which is the expensive case: unwatched processes only pay the filter.
--unwatched runs them under names the set does not watch instead, for what the set's
presence alone costs them (hooks that filter them out, its polling on the other CPUs): a
slowdown watched well above the in-kernel time, and as high unwatched, is not the watched
path's. --hook-floor adds a third run a round (first or last, in turns) with an empty program
on the hook of each of the set's programs that ran on that workload and no set: the kernel's
dispatch to a program (the tracepoint's call, bpf_trace_run's bookkeeping, the indirect call
into the program and the returns), which the BPF statistics do not time (they time the
program alone) and no program of ours can undercut. Before the rounds, each workload's count
is multiplied so that a bare run takes at least --min-seconds here (default 1): the counts
are sized for the development VM, and a faster host ran through them too quickly to read.

Every timed run starts after SETTLE_S of quiet: the set's start (a clang compile, seconds of
one CPU) came right before each run with the probes and never before one without. Then
(--warm-up, since 2026-12-05) an untimed run of a quarter of the count in the same setting:
a loop ran up to 40 % faster right after a run of itself than after anything else, and
which run of a round followed which swung its ratio (WARM_UP). Where the
machine has CPUs beside the two the workloads use (the ping-pong's ends on CPUs 0 and 1, the
single-threaded loops on CPU 1), this process polls the probes from those others, as the
daemon keeps its threads off the watched processes' CPUs (daemon/service/own_scheduling.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from gpujitter.probes import registry
from gpujitter.probes.bundle import hook_of
from gpujitter.probes.progstats import loaded_prog_stats
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

# Each program waits for a byte on stdin (so the probes watch it from its first call), runs,
# and prints how long its work took (CLOCK_MONOTONIC ns).
PROGRAMS = {
    # The two ends on CPUs 0 and 1 (where there are two): every hop wakes an idle CPU, the
    # probes' worst case, and the same placement in every run (left to the scheduler, the
    # ends share a CPU in some runs and not in others, which moved the time by 30 %).
    "pingpong": r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s);
    CPU_SET(cpu % sysconf(_SC_NPROCESSORS_ONLN), &s); sched_setaffinity(0, sizeof(s), &s); }
int main(int argc, char **argv) {
    long n = atol(argv[1]); int a[2], b[2]; char c = 0;
    if (pipe(a) || pipe(b) || read(0, &c, 1) != 1) return 1;
    long long t0 = now();
    if (fork() == 0) { pin(1);
        for (long i = 0; i < n; i++) { read(a[0], &c, 1); write(b[1], &c, 1); }
        _exit(0); }
    pin(argc > 2 ? atoi(argv[2]) : 0);
    for (long i = 0; i < n; i++) { write(a[1], &c, 1); read(b[0], &c, 1); }
    printf("%lld\n", now() - t0); return 0; }
""",
    "faults": r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
    long loops = atol(argv[1]); size_t len = 64 << 20; char c;
    if (read(0, &c, 1) != 1) return 1;
    long long t0 = now();
    for (long i = 0; i < loops; i++) {
        char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (size_t off = 0; off < len; off += 4096) p[off] = 1;
        munmap(p, len); }
    printf("%lld\n", now() - t0); return 0; }
""",
    "alloc": r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
    long n = atol(argv[1]); char c;
    if (read(0, &c, 1) != 1) return 1;
    long long t0 = now();
    for (long i = 0; i < n; i++) {   /* small, mid and large blocks: heap and mmap paths */
        size_t size = (i % 3 == 0) ? 64 : (i % 3 == 1) ? 96 << 10 : 40 << 20;
        char *p = malloc(size); p[0] = 1; p[size - 1] = 1; free(p); }
    printf("%lld\n", now() - t0); return 0; }
""",
    "steady": r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {   /* ~1 ms of host work, then a 1 ms wait, like a feeder */
    long n = atol(argv[1]), work = atol(argv[2]); char c; volatile unsigned long x = 0;
    struct timespec wait = {0, 1000000};
    if (read(0, &c, 1) != 1) return 1;
    long long t0 = now();
    for (long i = 0; i < n; i++) { for (long j = 0; j < work; j++) x += j;
        nanosleep(&wait, NULL); }
    printf("%lld\n", now() - t0); return 0; }
""",
}
# The malloc/free loop of an independent check (issue 12): 1M x 64 B, then 10k x 40 MiB.
PROGRAMS["alloc2"] = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
    long n = atol(argv[1]); char c;
    if (read(0, &c, 1) != 1) return 1;
    long long t0 = now();
    /* the empty asm keeps the compiler from eliding each malloc/free pair */
    for (long i = 0; i < n; i++) { char *p = malloc(64); p[0] = 1;
        __asm__ volatile("" : : "r"(p) : "memory"); free(p); }
    for (long i = 0; i < n / 100; i++) {
        size_t size = 40 << 20; char *p = malloc(size); p[0] = 1; p[size - 1] = 1;
        __asm__ volatile("" : : "r"(p) : "memory"); free(p); }
    printf("%lld\n", now() - t0); return 0; }
"""
# The same ping-pong with both ends on CPU 1 (opt-in): no idle CPU, no IPI, every watched
# thread's state written and read on one CPU; against the two-CPU one, what crossing CPUs
# adds to the programs' time.
PROGRAMS["samecpu"] = PROGRAMS["pingpong"]
DEFAULT_WORKLOADS = ("pingpong", "faults", "alloc", "alloc2", "steady")
ARGS = {
    "pingpong": ["100000"],
    "samecpu": ["100000", "1"],
    "faults": ["16"],
    "alloc": ["90000"],
    "alloc2": ["1000000"],
    "steady": ["500"],
}
# Hooks whose programs run once per scheduler event: their in-kernel time per event, watched
# and not, against an empty program on the same raw tracepoint (the statistics' own floor).
SCHED_EVENTS = ("sched_switch", "sched_waking")
FLOOR_BPF = """
RAW_TRACEPOINT_PROBE(sched_switch) { return 0; }
RAW_TRACEPOINT_PROBE(sched_waking) { return 0; }
"""


def build(where: Path, names: list[str]) -> dict[str, Path]:
    binaries = {}
    for name in names:
        src = where / f"gjb-{name}.c"
        src.write_text(PROGRAMS[name])
        binaries[name] = where / f"gjb-{name}"
        subprocess.run(["gcc", "-O2", "-o", str(binaries[name]), str(src)], check=True)
    return binaries


SETTLE_S = 1.0
LOOP_CPU = 1  # the single-threaded loops'
# The CPUs each workload runs on: the ping-pong's two ends (its code pins them), CPU 1 for
# the rest. The probe set's threads keep off them where any CPU is left, as the daemon's do
# (daemon/service/own_scheduling.py keep_off): on two CPUs the loops' runs have the set's
# polling and sampling on CPU 0, the ping-pong's share both.
WORKLOAD_CPUS = {"pingpong": frozenset({0, 1})}


def _on_workload_cpu() -> None:
    """A workload's place (a Popen preexec_fn): CPU 1 for the loops, which the ping-pong's
    own pinning overrides for its two ends."""
    os.sched_setaffinity(0, {LOOP_CPU})


def keep_off(workload: str, allowed: frozenset[int]) -> None:
    """This thread (and the probe set's threads started after it) on the CPUs of `allowed`
    that `workload` does not use, where there are any; else on all of `allowed`."""
    os.sched_setaffinity(0, (allowed - WORKLOAD_CPUS.get(workload, {LOOP_CPU})) or allowed)


def calibrate_steady(binary: Path) -> str:
    """Iterations of the inner loop that take about 1 ms here."""
    work = 200_000
    proc = subprocess.Popen([str(binary), "20", str(work)], stdin=subprocess.PIPE,
                            preexec_fn=_on_workload_cpu,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    out, _ = proc.communicate("g")
    per_iter_ns = int(out) / 20 - 1_000_000
    return str(max(1000, int(work * 1_000_000 / max(per_iter_ns, 1))))


def sized(binary: Path, args: list[str], min_s: float) -> list[str]:
    """args with the workload's count (the first) multiplied so that one bare run here takes
    min_s or more. At fixed counts a fast host's runs were over in 0.09-0.5 s and their rounds
    spread over 40-90 points, no reading at 5 % (the H200 of 2026-12-05)."""
    if min_s <= 0:
        return args
    elapsed_ns = run_workload(binary, args, None).elapsed_ns
    scale = math.ceil(min_s * 1e9 / max(elapsed_ns, 1))
    return [str(int(args[0]) * scale), *args[1:]] if scale > 1 else args


class Run(NamedTuple):
    elapsed_ns: int  # the workload's own clock around its work
    # CPU time of the workload process (user + system, from its reaped rusage), its start-up
    # included: what the wall clock holds less what the host ran elsewhere on the loop's CPU
    # (steal, with the kernel's steal accounting) and interrupts. The programs' runs in the
    # workload's own context (its faults, its system calls, its switches out) are in it. The
    # ping-pong's second end is never reaped: its figure is one end's only.
    cpu_ns: int


# The share of a workload's count run, untimed, right before each timed run (--warm-up). A
# loop's speed depends on what ran on the machine in the second before it: on an H100 host
# (2026-12-05) the `alloc` loop took 1.12-1.37 s bare when it followed a run of itself and
# 1.54-1.86 s when it followed another workload, its CPU time alike (the pages a 40 MiB
# block gets back are still in the caches, or not), and the run with the set always
# followed the set's compile: each round's ratio swung by +-30 % with the order.
WARM_UP = 0.25


def _children_cpu_ns() -> int:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round((ru.ru_utime + ru.ru_stime) * 1e9)


def run_workload(
    binary: Path,
    args: list[str],
    probes: ProbeSet | None,
    warm_up: float = 0.0,
    timed: Callable[[], object] = lambda: None,
) -> Run:
    """One run's elapsed and CPU time, after SETTLE_S of quiet and, where `warm_up` is a
    share (of the count), an untimed run of that much of the same workload in the same
    setting; while it runs, the probes (if any) are polled as the daemon polls them.
    `timed` is called as the timed run begins (the warm-up's events drained)."""
    time.sleep(SETTLE_S)
    if warm_up > 0:
        _run_once(binary, [str(max(1, round(int(args[0]) * warm_up))), *args[1:]], probes)
    timed()
    return _run_once(binary, args, probes)


def _run_once(binary: Path, args: list[str], probes: ProbeSet | None) -> Run:
    cpu0 = _children_cpu_ns()
    proc = subprocess.Popen([str(binary), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, preexec_fn=_on_workload_cpu)  # fmt: skip
    if probes is not None:
        probes.core.refresh(time.monotonic_ns())  # watched before its first call
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("g")
    proc.stdin.close()
    while proc.poll() is None:
        if probes is not None:
            # No cost meter here: a fresh set's meter switches the BPF statistics on at its
            # first tick for a second (progstats.CostMeter), which held every loop shorter
            # than that inside the statistics' two clock reads a program run (~3 points of
            # the fault loop's slowdown); the daemon has them on a second a minute, and the
            # kernel run below has them on for the in-kernel figures.
            probes.poll()
        time.sleep(0.05)
    if probes is not None:
        probes.poll()
    return Run(int(proc.stdout.read()), _children_cpu_ns() - cpu0)


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    path = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = path.read_text().strip()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(old)


@contextlib.contextmanager
def floor_programs() -> Iterator[Any]:
    """Empty programs on the scheduler's raw tracepoints, for the floor of the figures."""
    from bcc import BPF

    bpf = BPF(text=FLOOR_BPF)
    try:
        yield bpf
    finally:
        bpf.cleanup()


def mirror_hooks(
    programs: list[str], shared: dict[str, list[str]] | None = None
) -> tuple[list[tuple[str, str]], list[str]]:
    """The hook of each of the set's programs (probe:function) that an empty program can
    take: ("raw", event) or ("tp", "category:event"), one per program (the kernel runs each
    attached program of a hook in turn), and every raw tracepoint of a program that `shared`
    names (one program on several hooks, attached with cookies: which of them ran is not
    known, and an empty program on a hook that does not fire costs nothing); and the
    programs left out (perf events, uprobes: their hooks are not named by the function)."""
    hooks, left = [], []
    for name in programs:
        if hook := hook_of(name.partition(":")[2]):
            hooks.append(hook)
        elif shared and name in shared:
            hooks += [("raw", event) for event in shared[name]]
        else:
            left.append(name)
    return hooks, left


def shared_hooks(probes: ProbeSet) -> dict[str, list[str]]:
    """probe:function -> the raw tracepoints of each program the set attached with cookies."""
    out = {}
    for probe in probes.running:
        for fn, events in getattr(bcc_object(probe), "shared_hooks", {}).items():
            out[f"{probe.name}:{fn}"] = list(events)
    return out


@contextlib.contextmanager
def hook_floor(hooks: list[tuple[str, str]]) -> Iterator[Any]:
    """An empty program on each of `hooks`: what the kernel's dispatch to any program there
    costs a workload, which the BPF statistics (timing the program alone) do not see."""
    from bcc import BPF

    if not hooks:  # none of the set's programs ran on the workload: nothing to mirror
        yield None
        return
    text = "\n".join(
        f"int floor_{i}(struct bpf_raw_tracepoint_args *ctx) {{ return 0; }}"
        if kind == "raw"
        else f"int floor_{i}(void *ctx) {{ return 0; }}"
        for i, (kind, _) in enumerate(hooks)
    )
    bpf = BPF(text=text)
    try:
        for i, (kind, target) in enumerate(hooks):
            if kind == "raw":
                bpf.attach_raw_tracepoint(tp=target, fn_name=f"floor_{i}")
            else:
                bpf.attach_tracepoint(tp=target, fn_name=f"floor_{i}")
        yield bpf
    finally:
        bpf.cleanup()


def program_totals(probes: ProbeSet, floor: Any = None) -> dict[str, tuple[int, int]]:
    """(runs, ns) of every loaded program of every probe, by probe:program; the floor's
    programs as floor:program."""
    out: dict[str, tuple[int, int]] = {}
    if floor is not None:
        for fn, st in loaded_prog_stats(floor).items():
            out[f"floor:{fn}"] = (st.run_cnt, st.run_time_ns)
    seen: set[int] = set()
    for probe in probes.running:
        bpf = bcc_object(probe)
        if bpf is None or id(bpf) in seen:
            continue
        seen.add(id(bpf))
        for fn, st in loaded_prog_stats(bpf).items():
            out[f"{probe.name}:{fn}"] = (st.run_cnt, st.run_time_ns)
    return out


def bcc_object(probe: Any) -> Any:
    """The bcc object that holds a probe's programs: its own, or the one faults and swap
    share (FaultPrograms). A probe that reports programs for its cost but holds neither is
    an error here, not a probe left out of the figures."""
    for holder in (probe, getattr(probe, "loaded", None)):
        bpf = getattr(holder, "bpf", None)
        if bpf is not None:
            return bpf
    if probe.programs():
        raise RuntimeError(f"{probe.name}: runs BPF programs, but no bcc object was found")
    return None


def kernel_run(
    probes: ProbeSet, floor: Any, binary: Path, args: list[str]
) -> dict[str, tuple[int, int]]:
    """(runs, ns) of each program during one run of the workload, statistics on."""
    before = program_totals(probes, floor)
    run_workload(binary, args, probes)
    after = program_totals(probes, floor)
    return {
        k: (after[k][0] - before.get(k, (0, 0))[0], after[k][1] - before.get(k, (0, 0))[1])
        for k in after
    }


def record_programs(into: dict[str, list[float]], delta: dict[str, tuple[int, int]]) -> None:
    """ns per run of each program that ran, appended to its list."""
    for k, (n, t) in delta.items():
        if n:
            into.setdefault(k, []).append(t / n)


def measure(
    rounds: int,
    names: list[str],
    workloads: list[str],
    watched: bool = True,
    hook_floors: bool = False,
    min_s: float = 0.0,
    warm_up: float = WARM_UP,
) -> dict[str, Any]:
    topology = load_topology()
    allowed = frozenset(os.sched_getaffinity(0))
    me = psutil.Process()
    results: dict[str, Any] = {
        "probes": names, "watched": watched, "startup": [], "rss_mb": [], "workloads": {}
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        binaries = build(Path(tmp), workloads)
        # the same programs under names the probes do not watch: what every other process pays
        others = {w: Path(tmp) / f"gju-{w}" for w in workloads}
        for w, path in others.items():
            shutil.copy(binaries[w], path)
        timed = binaries if watched else others
        args = dict(ARGS)
        if "steady" in workloads:
            args["steady"] = [ARGS["steady"][0], calibrate_steady(binaries["steady"])]
        for w in workloads:
            args[w] = sized(timed[w], args[w], min_s)
        results["args"] = {w: args[w] for w in workloads}
        results["warm_up"] = warm_up
        base: dict[str, list[Run]] = {w: [] for w in workloads}
        probed: dict[str, list[Run]] = {w: [] for w in workloads}
        rates: dict[str, list[float]] = {w: [] for w in workloads}
        kernel: dict[str, list[float]] = {w: [] for w in workloads}
        runs_per_op: dict[str, list[int]] = {w: [] for w in workloads}
        programs: dict[str, dict[str, list[float]]] = {w: {} for w in [*workloads, "unwatched"]}
        floored: dict[str, list[Run]] = {w: [] for w in workloads}
        mirrored: dict[str, tuple[list[tuple[str, str]], list[str]]] = {}
        shared: dict[str, list[str]] = {}  # programs on several hooks (from the set's runs)

        def floor_run(w: str) -> None:
            # the hooks of the set's programs that ran on this workload (its kernel runs)
            own = sorted(k for k in programs[w] if not k.startswith("floor:"))
            mirrored[w] = mirror_hooks(own, shared)
            with hook_floor(mirrored[w][0]):
                floored[w].append(run_workload(timed[w], args[w], None, warm_up))

        watch = WatchSpec(comms=[f"gjb-{name}" for name in PROGRAMS])
        for r in range(rounds):
            for w in workloads:
                # A workload's runs without and with the probes next to each other (the set
                # started between them), in turns first and second: over a round's minutes
                # the shared machine's load drifts by more than the probes cost.
                if r % 2 == 0:
                    base[w].append(run_workload(timed[w], args[w], None, warm_up))
                elif hook_floors:
                    floor_run(w)
                events: list[Any] = []
                keep_off(w, allowed)
                cpu0, wall0 = sum(me.cpu_times()[:2]), time.monotonic()
                with ProbeSet(names, topology=topology, watch=watch, emit=events.append) as probes:
                    probes.start()
                    results["startup"].append(
                        {
                            "wall_s": time.monotonic() - wall0,
                            "cpu_s": sum(me.cpu_times()[:2]) - cpu0,
                        }
                    )
                    results["rss_mb"].append(me.memory_info().rss / 2**20)
                    shared.update(shared_hooks(probes))
                    # The events of the timed run alone: the warm-up's would inflate its rate.
                    run = run_workload(timed[w], args[w], probes, warm_up, timed=events.clear)
                    probed[w].append(run)
                    rates[w].append(len(events) / (run.elapsed_ns / 1e9))
                    # A separate run for the in-kernel time: the statistics themselves cost
                    # two clock reads per program run, which must not count in the slowdown.
                    with bpf_stats(), floor_programs() as floor:
                        delta = kernel_run(probes, floor, timed[w], args[w])
                        record_programs(programs[w], delta)
                        own = {k: d for k, d in delta.items() if not k.startswith("floor:")}
                        runs = sum(d[0] for d in own.values())
                        kernel[w].append(sum(d[1] for d in own.values()) / runs if runs else 0.0)
                        runs_per_op[w].append(runs)
                        if w == "pingpong" and watched:
                            delta = kernel_run(probes, floor, others[w], args[w])
                            record_programs(programs["unwatched"], delta)
                if r % 2 == 1:
                    base[w].append(run_workload(timed[w], args[w], None, warm_up))
                elif hook_floors:
                    floor_run(w)
        for w in workloads:
            b = statistics.median(x.elapsed_ns for x in base[w])
            p = statistics.median(x.elapsed_ns for x in probed[w])
            ratios = round_ratios(base[w], probed[w], "elapsed_ns")
            cpu_ratios = round_ratios(base[w], probed[w], "cpu_ns")
            results["workloads"][w] = {
                "without_s": b / 1e9,
                "with_s": p / 1e9,
                "slowdown_pct": statistics.median(ratios),
                "slowdown_pct_rounds": ratios,
                "cpu_slowdown_pct": statistics.median(cpu_ratios),
                "cpu_slowdown_pct_rounds": cpu_ratios,
                "without_s_rounds": [x.elapsed_ns / 1e9 for x in base[w]],
                "with_s_rounds": [x.elapsed_ns / 1e9 for x in probed[w]],
                "without_cpu_s_rounds": [x.cpu_ns / 1e9 for x in base[w]],
                "with_cpu_s_rounds": [x.cpu_ns / 1e9 for x in probed[w]],
                "kernel_ns_per_run": statistics.median(kernel[w]),
                "program_runs": statistics.median(runs_per_op[w]),
                "python_events_per_s": statistics.median(rates[w]),
                "program_runs_per_op": statistics.median(runs_per_op[w]) / int(args[w][0]),
                "kernel_ns_per_program": {
                    k: statistics.median(v) for k, v in sorted(programs[w].items())
                },
            }
            if hook_floors:
                ratios = round_ratios(base[w], floored[w], "elapsed_ns")
                cpu_ratios = round_ratios(base[w], floored[w], "cpu_ns")
                hooks, left = mirrored[w]
                results["workloads"][w].update(
                    hook_floor_pct=statistics.median(ratios),
                    hook_floor_pct_rounds=ratios,
                    hook_floor_cpu_pct=statistics.median(cpu_ratios),
                    hook_floor_cpu_pct_rounds=cpu_ratios,
                    hook_floor_s_rounds=[x.elapsed_ns / 1e9 for x in floored[w]],
                    hook_floor_programs=len(hooks),
                    hook_floor_left_out=left,
                )
    results["startup_median"] = {
        k: statistics.median(s[k] for s in results["startup"]) for k in ("wall_s", "cpu_s")
    }
    results["rss_mb_median"] = statistics.median(results["rss_mb"])
    results["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["sched_event_ns"] = sched_event_ns(programs, watched)
    return results


def round_ratios(base: list[Run], other: list[Run], field: str) -> list[float]:
    """Each round's slowdown (%) against its own run without probes, sorted: drift between
    rounds cancels."""
    return sorted(
        100 * (getattr(o, field) - getattr(b, field)) / max(getattr(b, field), 1)
        for b, o in zip(base, other, strict=True)
    )


def sched_event_ns(
    programs: dict[str, dict[str, list[float]]], watched: bool
) -> dict[str, dict[str, float]]:
    """In-kernel ns per scheduler event on the ping-pong, watched and not (only unwatched
    where the workloads ran so): every probe's program on that hook together (each runs once
    per event), and the empty program's."""
    out: dict[str, dict[str, float]] = {}
    modes = [("watched", "pingpong"), ("unwatched", "unwatched")]
    if not watched:
        modes = [("unwatched", "pingpong")]
    modes = [(m, w) for m, w in modes if programs.get(w)]
    for event in SCHED_EVENTS:
        row = {}
        for mode, w in modes:
            row[mode] = sum(
                statistics.median(v)
                for k, v in programs[w].items()
                if k.endswith(f"__{event}") and not k.startswith("floor:")
            )
            row[f"{mode}_floor"] = statistics.median(
                programs[w].get(f"floor:raw_tracepoint__{event}", [0.0])
            )
        out[event] = row
    return out


def report(r: dict[str, Any]) -> str:
    first = r["startup"][0]
    floored = any("hook_floor_pct" in x for x in r["workloads"].values())
    lines = [
        f"probes: {', '.join(r['probes'])}"
        + ("" if r["watched"] else " (the workloads unwatched: the set's presence alone)"),
        f"start-up (compile + attach), median of {len(r['startup'])} starts: "
        f"{r['startup_median']['wall_s']:.2f} s wall, {r['startup_median']['cpu_s']:.2f} CPU-s "
        f"(the first, with the core's compile: {first['wall_s']:.1f} / {first['cpu_s']:.1f}); "
        f"resident {r['rss_mb_median']:.0f} MB after start (max {max(r['rss_mb']):.0f}), "
        f"peak {r['rss_peak_mb']:.0f} MB",
        *(
            f"in-kernel per {event}: "
            + ", ".join(f"{m} {x[m]:.0f} ns" for m in ("watched", "unwatched") if m in x)
            + " (all probes' programs on it; an empty program "
            + " / ".join(f"{x[m + '_floor']:.0f}" for m in ("watched", "unwatched") if m in x)
            + " ns)"
            for event, x in r["sched_event_ns"].items()
            if x  # no ping-pong run: no scheduler figures
        ),
        "counts: "
        + ", ".join(f"{w} {' '.join(a)}" for w, a in r["args"].items())
        + (
            f"; before each timed run an untimed {r['warm_up']:g} of it" if r.get("warm_up") else ""
        ),
        f"{'workload':10} {'without':>9} {'with':>9} {'slowdown':>9} {'(min..max)':>15} "
        f"{'CPU time':>9} {'(min..max)':>15} {'kernel/run':>11} {'runs/op':>8} {'py ev/s':>8}"
        + (f" {'hook floor':>10} {'(min..max)':>15} {'its CPU':>8}" if floored else ""),
    ]
    for w, x in r["workloads"].items():
        lo, hi = x["slowdown_pct_rounds"][0], x["slowdown_pct_rounds"][-1]
        # A run from before the CPU time (its JSON) has no such column: "-" there.
        cpu = x.get("cpu_slowdown_pct_rounds")
        cpu_text = (
            f"{x['cpu_slowdown_pct']:8.1f}% {f'({cpu[0]:.1f}..{cpu[-1]:.1f})':>15}"
            if cpu
            else f"{'-':>9} {'':>15}"
        )
        line = (
            f"{w:10} {x['without_s']:8.3f}s {x['with_s']:8.3f}s {x['slowdown_pct']:8.1f}% "
            f"{f'({lo:.1f}..{hi:.1f})':>15} {cpu_text} {x['kernel_ns_per_run']:9.0f}ns "
            f"{x['program_runs_per_op']:8.1f} {x['python_events_per_s']:8.0f}"
        )
        if "hook_floor_pct" in x:
            lo, hi = x["hook_floor_pct_rounds"][0], x["hook_floor_pct_rounds"][-1]
            line += f" {x['hook_floor_pct']:9.1f}% {f'({lo:.1f}..{hi:.1f})':>15}"
            if "hook_floor_cpu_pct" in x:
                line += f" {x['hook_floor_cpu_pct']:7.1f}%"
        lines.append(line)
    if floored:
        left = sorted({n for x in r["workloads"].values() for n in x["hook_floor_left_out"]})
        lines.append(
            "hook floor: an empty program on the hook of each of the set's programs that ran "
            "on the workload (the kernel's dispatch, which the statistics do not time)"
            + (f"; not mirrored: {', '.join(left)}" if left else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--probes", help="comma-separated (default: the registry's default set)")
    p.add_argument("--workloads", help=f"comma-separated, of {','.join(PROGRAMS)} "
                   f"(default: {','.join(DEFAULT_WORKLOADS)})")  # fmt: skip
    p.add_argument("--unwatched", action="store_true",
                   help="run the workloads under names the set does not watch")  # fmt: skip
    p.add_argument(
        "--hook-floor",
        action="store_true",
        help="a third run a round with an empty program on each hook the set's programs ran "
        "on: the part of the slowdown that any program there costs",
    )
    p.add_argument(
        "--min-seconds",
        type=float,
        default=1.0,
        metavar="S",
        help="scale each workload's count so that a bare run takes at least S seconds here "
        "(default 1; 0: the fixed counts)",
    )
    p.add_argument(
        "--warm-up",
        type=float,
        default=WARM_UP,
        metavar="SHARE",
        help=f"before each timed run, an untimed one of this share of its count in the same "
        f"setting (default {WARM_UP}; 0: none, as before 2026-12-05)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = args.probes.split(",") if args.probes else registry.default_names()
    workloads = args.workloads.split(",") if args.workloads else list(DEFAULT_WORKLOADS)
    unknown = sorted(set(workloads) - set(PROGRAMS))
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(PROGRAMS)}")
    results = measure(args.rounds, names, workloads, watched=not args.unwatched,
                      hook_floors=args.hook_floor, min_s=args.min_seconds,
                      warm_up=args.warm_up)  # fmt: skip
    print(json.dumps(results, indent=2) if args.json else report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
