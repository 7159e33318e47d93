"""Cost of the irq probe, in one run: three workloads timed without the probe, with it
watching the workload (every interrupt that lands on it takes the stolen-time path), and
with it watching nothing of the workload (what every other process pays); the programs'
in-kernel time per run (kernel.bpf_stats_enabled, switched on only for its own round);
records delivered to Python per second; start-up (compile and attach) wall and CPU time;
and this process's CPU and memory while the probe runs.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.irq [--rounds 5] [--json]

Workloads (C, built here): `reads`, O_DIRECT 4 KiB reads of a file on the root disk, one
completion interrupt each, with a spinner on the same CPU so that the interrupts land on a
running task; `pingpong`, a byte bounced between two CPUs through pipes (a wake-up IPI per
hop); `feed`, a steady loop of 200 us of work and a 50 us sleep (timer interrupts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpujitter.probes.events import Event
from gpujitter.probes.host import HostPaths, parse_cpulist
from gpujitter.probes.interrupts import read_table
from gpujitter.probes.progstats import ProgStats, loaded_prog_stats
from gpujitter.probes.runner import ProbeSet, ProbeThread
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
WORKLOAD = "gj-irq-workload"  # the workload binary's name, by which it is watched

WORKLOADS_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

/* reads FILE N CPU | pingpong N | feed N WORK_NS WAIT_NS | syscalls N: waits for a byte on
 * stdin, runs, prints the nanoseconds per operation. */
int main(int argc, char **argv)
{
    char c;
    long n = atol(argv[argc > 3 && argv[1][0] == 'r' ? 3 : 2]);
    long long t0, t1;
    if (read(0, &c, 1) != 1)
        return 1;
    if (argv[1][0] == 'r') {
        int cpu = atoi(argv[4]);
        pid_t spinner = fork();
        if (spinner == 0) {
            pin(cpu);
            for (;;)
                __asm__ volatile("" ::: "memory");
        }
        pin(cpu);
        int fd = open(argv[2], O_RDONLY | O_DIRECT);
        void *buf;
        if (fd < 0 || posix_memalign(&buf, 4096, 4096))
            return 1;
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            if (pread(fd, buf, 4096, (i % 16384) * 4096) != 4096)
                return 1;
        t1 = now_ns();
        kill(spinner, 9);
        waitpid(spinner, NULL, 0);
    } else if (argv[1][0] == 'p') {
        int ab[2], ba[2];
        if (pipe(ab) || pipe(ba))
            return 1;
        pid_t peer = fork();
        if (peer == 0) {
            pin(1);
            for (long i = 0; i < n; i++)
                if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
                    _exit(1);
            _exit(0);
        }
        pin(0);
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
                return 1;
        t1 = now_ns();
        waitpid(peer, NULL, 0);
    } else if (argv[1][0] == 's') {
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            syscall(SYS_getppid);
        t1 = now_ns();
    } else {
        long long work = atol(argv[3]);
        struct timespec wait = {0, atol(argv[4])};
        volatile unsigned long x = 0;
        t0 = now_ns();
        for (long i = 0; i < n; i++) {
            long long until = now_ns() + work;
            while (now_ns() < until)
                x++;
            nanosleep(&wait, NULL);
        }
        t1 = now_ns();
    }
    printf("%.1f\n", (double)(t1 - t0) / n);
    return 0;
}
"""


class Workloads:
    def __init__(self, directory: Path, disk_cpu: int) -> None:
        self.exe = directory / WORKLOAD
        src = directory / "workloads.c"
        src.write_text(WORKLOADS_C)
        cc = shutil.which("cc") or shutil.which("gcc-12") or "gcc"
        subprocess.run([cc, "-O2", "-o", str(self.exe), str(src)], check=True)
        self.file = Path("/var/tmp") / f"gpujitter-bench-irq-{os.getpid()}"
        with open(self.file, "wb") as f:
            f.write(os.urandom(64 << 20))
            os.fsync(f.fileno())
        self.args = {
            "reads": ["reads", str(self.file), "20000", str(disk_cpu)],
            "pingpong": ["pingpong", "100000"],
            "feed": ["feed", "4000", "200000", "50000"],
        }
        self.syscalls = ["syscalls", "1000000"]

    def start(self, name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.exe), *(self.syscalls if name == "syscalls" else self.args[name])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        self.file.unlink()


def finish(proc: subprocess.Popen[str]) -> float:
    out, _ = proc.communicate("g", timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"workload {proc.args} failed with status {proc.returncode}")
    return float(out)


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    before = BPF_STATS.read_text().strip()
    BPF_STATS.write_text("1")
    try:
        yield
    finally:
        BPF_STATS.write_text(before)


class Attached:
    """The irq probe running in its own thread, recording what reaches Python. Workloads
    are watched by command name (the core adds a process on its exec, and its children
    as they fork), switched on and off between rounds."""

    def __init__(self) -> None:
        self.watch = WatchSpec()
        self.kinds: Counter[str] = Counter()
        self.thread = ProbeThread(
            ["irq"],
            topology=load_topology(),
            watch=self.watch,
            emit=self.record,
            thresholds={"irq": {"stolen": 0}},
        )

    def record(self, ev: Event) -> bool:
        self.kinds[ev.KIND] += 1
        return True

    def watching(self, on: bool) -> Callable[[int], None]:
        def before(_pid: int) -> None:
            time.sleep(0.3)  # the exec event reaches the core within a poll

        self.watch.comms = [WORKLOAD] if on else []
        return before


def disk_cpu() -> int:
    for row in read_table(HostPaths()).values():
        if row.name.startswith("virtio") and "req" in row.name:
            effective = Path(f"/proc/irq/{row.label}/effective_affinity_list").read_text()
            return parse_cpulist(effective)[0]
    return 0


def timed(workloads: Workloads, name: str, before: Callable[[int], None]) -> float:
    proc = workloads.start(name)
    before(proc.pid)
    return finish(proc)


def startup() -> dict[str, float]:
    """Wall and CPU seconds from nothing to the irq probe attached (core module included)."""
    wall, cpu = time.monotonic(), time.process_time()
    with ProbeSet(
        ["irq"], topology=load_topology(), watch=WatchSpec(), emit=lambda ev: True
    ) as probes:
        probes.start()
        return {
            "wall_s": round(time.monotonic() - wall, 2),
            "cpu_s": round(time.process_time() - cpu, 2),
        }


def measure(n_rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {"startup": startup()}
    with tempfile.TemporaryDirectory() as tmp:
        workloads = Workloads(Path(tmp), disk_cpu())
        try:
            result["ns_per_op"], result["ratio"] = slowdown(workloads, n_rounds)
            result["python"] = delivered(workloads)
            result["in_kernel"] = in_kernel_cost(workloads)
            result["hook_ns"] = hook_kinds(workloads, n_rounds)
        finally:
            workloads.close()
    return result


def slowdown(workloads: Workloads, n_rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each round runs every workload with the probe's hooks detached, attached with the
    workload watched, and attached with it not watched (compiled once; the hooks toggled
    between runs). Medians of the runs, and medians of each round's ratios to its own run
    without the probe (the machine is shared: rounds drift, ratios within a round less)."""
    watch = WatchSpec()
    runs: dict[str, dict[str, list[float]]] = {n: {} for n in workloads.args}
    with ProbeSet(["irq"], topology=load_topology(), watch=watch, emit=lambda ev: True) as probes:
        probes.start()
        irq = probes.probes[0]
        bpf = irq.bpf  # type: ignore[attr-defined]

        def run(name: str, mode: str) -> None:
            if mode == "off":
                bpf.detach()  # the part's raw tracepoints; its programs and maps stay loaded
            watch.comms = [WORKLOAD] if mode == "watched" else []
            proc = workloads.start(name)
            time.sleep(0.3)
            probes.poll()  # the exec event: a watched workload joins the set
            runs[name].setdefault(mode, []).append(finish(proc))
            probes.tick(time.monotonic_ns())  # hand over what the maps gathered
            if mode == "off":
                bpf.attach_hooks()  # irq leaves none of its hooks to another part
                irq.attach(probes.ctx)  # and its vectors' shared programs, with their cookies

        for _ in range(n_rounds):
            for name in workloads.args:
                for mode in ("off", "watched", "unwatched"):
                    run(name, mode)
    medians = {
        name: {mode: statistics.median(v) for mode, v in modes.items()}
        for name, modes in runs.items()
    }
    ratios = {
        name: {
            mode: round(statistics.median(r / o for r, o in zip(v, modes["off"], strict=True)), 3)
            for mode, v in modes.items()
            if mode != "off"
        }
        for name, modes in runs.items()
    }
    return medians, ratios


def delivered(workloads: Workloads) -> dict[str, Any]:
    """What reaches Python while every workload runs once, watched, and what that costs
    this process: records per second by kind, CPU, peak resident memory."""
    attached = Attached()
    with attached.thread:
        cpu0, wall0 = time.process_time(), time.monotonic()
        for name in workloads.args:
            timed(workloads, name, attached.watching(True))
        wall = time.monotonic() - wall0
    return {
        "records_per_s": round(sum(attached.kinds.values()) / wall, 1),
        "by_kind": dict(attached.kinds),
        "cpu_percent": round(100 * (time.process_time() - cpu0) / wall, 2),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def in_kernel_cost(workloads: Workloads) -> dict[str, dict[str, float]]:
    """Mean ns per program run over all workloads once, watched (the stolen-time path),
    beside an empty program on the same hook: the floor that dispatch and the statistics'
    own clock reads cost on this machine."""
    from bcc import BPF

    watch = WatchSpec(comms=[WORKLOAD])
    with (
        bpf_stats(),
        ProbeSet(["irq"], topology=load_topology(), watch=watch, emit=lambda ev: True) as probes,
    ):
        probes.start()
        ours = probes.probes[0].bpf  # type: ignore[attr-defined]
        hooks = list(ours.raw_tracepoint_fds)  # the raw tracepoints it attached, by event
        ours_prefix = ours.prefix + "__raw_tracepoint__"  # its programs' names in the bundle
        # A program on several hooks (the vectors', attached with cookies) has one set of
        # statistics for all of them: it is reported once, against its hooks' empty programs.
        shared = {fn: list(events) for fn, events in ours.shared_hooks.items()}
        empty = BPF(text="".join(f"RAW_TRACEPOINT_PROBE({h}) {{ return 0; }}\n" for h in hooks))
        try:
            for name in workloads.args:

                def watched(_pid: int) -> None:
                    time.sleep(0.2)
                    probes.poll()  # the exec event: the workload joins the watched set

                timed(workloads, name, watched)
            stats, floor = loaded_prog_stats(ours), loaded_prog_stats(empty)
        finally:
            empty.cleanup()
    one_each = {e for events in shared.values() for e in events}
    out = {
        hook: {
            "runs": s.run_cnt,
            "ns_per_run": per_run(s),
            "empty_ns_per_run": per_run(floor[f"raw_tracepoint__{hook}"]),
        }
        for hook in hooks
        if hook not in one_each and (s := stats[ours_prefix + hook]).run_cnt
    }
    for fn, events in shared.items():
        if (s := stats[fn]).run_cnt:
            floors = [floor[f"raw_tracepoint__{e}"] for e in events]
            runs, ns = sum(f.run_cnt for f in floors), sum(f.run_time_ns for f in floors)
            out[f"{fn} ({', '.join(events)})"] = {
                "runs": s.run_cnt,
                "ns_per_run": per_run(s),
                "empty_ns_per_run": round(ns / runs, 1) if runs else 0.0,
            }
    return out


def hook_kinds(workloads: Workloads, n_rounds: int) -> dict[str, float]:
    """What a hook costs by itself, perf tracepoint against raw tracepoint: a getppid loop
    with an empty program on raw_syscalls:sys_enter attached either way (ns per syscall
    over the loop alone, median of rounds)."""
    from bcc import BPF

    kinds = {
        "perf tracepoint": "TRACEPOINT_PROBE(raw_syscalls, sys_enter) { return 0; }",
        "raw tracepoint": "RAW_TRACEPOINT_PROBE(sys_enter) { return 0; }",
    }
    runs: dict[str, list[float]] = {"none": [], **{k: [] for k in kinds}}
    for _ in range(n_rounds):
        runs["none"].append(finish(workloads.start("syscalls")))
        for kind, text in kinds.items():
            bpf = BPF(text=text)
            try:
                runs[kind].append(finish(workloads.start("syscalls")))
            finally:
                bpf.cleanup()
    base = statistics.median(runs["none"])
    return {k: round(statistics.median(v) - base, 1) for k, v in runs.items() if k != "none"}


def per_run(s: ProgStats) -> float:
    return round(s.run_time_ns / s.run_cnt, 1) if s.run_cnt else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"start-up: {result['startup']}")
    for name, modes in result["ns_per_op"].items():
        ratios = ", ".join(f"{m} x{r}" for m, r in result["ratio"][name].items())
        print(f"{name:9s} {modes['off']:10.1f} ns/op off; {ratios}")
    print(f"python: {result['python']}")
    print(f"an empty program's hook, ns per event: {result['hook_ns']}")
    for prog, s in result["in_kernel"].items():
        print(
            f"  {prog:28s} {s['runs']:8d} runs {s['ns_per_run']:7.1f} ns/run"
            f" (empty program: {s['empty_ns_per_run']:.1f})"
        )


if __name__ == "__main__":
    main()
