"""Cost of the sched and cstate probes: slowdown of a context-switch-heavy pipe ping-pong and
of a steady feeding loop with the probes attached (workload watched, and not watched), the
probes' in-kernel time per event (kernel BPF statistics), what Python receives, and start-up.

Run as root, alone on the machine as far as possible (the figures are ratios within one run):

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.sched_cstate [--json]

Workloads are small C programs (compiled here with cc) so that the probes' cost is not
hidden behind an interpreter. Each runs with the probes' tracepoints detached, with the
probes watching it, and with the probes attached but watching another program, the three
interleaved run by run; ratios compare medians.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujitter.probes.base import Probe
from gpujitter.probes.events import Event
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

PROBES = ("sched", "cstate")
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")

# Two processes bounce one byte through two pipes: every round trip is two wake-ups and, on
# two CPUs, four context switches and two idle entries and exits.
PINGPONG_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    char c;
    int ab[2], ba[2];
    if (argc < 4 || read(0, &c, 1) != 1 || pipe(ab) || pipe(ba))
        return 1;
    pid_t peer = fork();
    if (peer == 0) {
        pin(atoi(argv[3]));
        for (long i = 0; i < n; i++)
            if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
                _exit(1);
        _exit(0);
    }
    pin(atoi(argv[2]));
    long long t0 = now_ns();
    for (long i = 0; i < n; i++)
        if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
            return 1;
    long long t1 = now_ns();
    waitpid(peer, NULL, 0);
    printf("%lld\n", t1 - t0);
    return 0;
}
"""

# A thread feeding a GPU: a fixed slice of host work, then a short wait, over and over.
FEEDER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(int argc, char **argv) {
    long n = atol(argv[1]), work = atol(argv[2]);
    struct timespec wait = {0, atol(argv[3])};
    char c;
    volatile unsigned long x = 0;
    if (read(0, &c, 1) != 1)
        return 1;
    long long t0 = now_ns();
    for (long i = 0; i < n; i++) {
        for (long j = 0; j < work; j++)
            x += j;
        nanosleep(&wait, NULL);
    }
    printf("%lld\n", now_ns() - t0);
    return 0;
}
"""


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    binary: Path
    args: tuple[str, ...]
    ops: int  # round trips or iterations per run

    def watch(self) -> WatchSpec:
        return WatchSpec(comms=[self.binary.name])

    def start(self, unwatched: bool = False) -> subprocess.Popen[str]:
        """Started and waiting for one byte on stdin, so that probes can watch it first;
        `unwatched`: the same program under another name, which the probes do not watch."""
        binary = self.binary.with_name(self.binary.name + "-u") if unwatched else self.binary
        return subprocess.Popen(
            [str(binary), *self.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )


@dataclass(frozen=True, slots=True)
class Run:
    elapsed_ns: int  # as the workload measured itself
    cpu_ns: int  # user + system time of the workload's processes (BPF runs count as system)


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("g")
    proc.stdin.close()


def reap(proc: subprocess.Popen[str], wait: bool = True) -> Run | None:
    """The finished run (None while it runs, without `wait`); wait4's usage covers the
    workload and the children it waited for."""
    pid, status, usage = os.wait4(proc.pid, 0 if wait else os.WNOHANG)
    if pid == 0:
        return None
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"workload {proc.args} failed: status {status}")
    assert proc.stdout is not None
    cpu_ns = round((usage.ru_utime + usage.ru_stime) * 1e9)
    return Run(elapsed_ns=int(proc.stdout.read()), cpu_ns=cpu_ns)


def finish(proc: subprocess.Popen[str]) -> Run:
    """Release the workload and wait for it."""
    release(proc)
    run = reap(proc)
    assert run is not None
    return run


def compile_c(source: str, name: str, where: Path) -> Path:
    src, exe = where / f"{name}.c", where / name
    src.write_text(source)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    shutil.copy(exe, exe.with_name(name + "-u"))
    return exe


def calibrate_work(feeder: Path, target_ns: int) -> int:
    """Loop count for target_ns of host work per feeder iteration on this CPU."""
    work = 100_000
    per_iter = finish(Workload("calibrate", feeder, ("20", str(work), "0"), 20).start()).cpu_ns / 20
    return max(1, round(work * target_ns / per_iter))


@dataclass(slots=True)
class ProgStats:
    """Kernel BPF statistics of one program: run count and total run time."""

    name: str
    fd: int

    def read(self) -> tuple[int, int]:
        info = dict(
            line.split(":", 1)
            for line in Path(f"/proc/self/fdinfo/{self.fd}").read_text().splitlines()
            if ":" in line
        )
        return int(info.get("run_cnt", "0")), int(info.get("run_time_ns", "0"))


def prog_stats(probes: list[Probe]) -> list[ProgStats]:
    return [
        ProgStats(f"{p.name}:{name.decode() if isinstance(name, bytes) else name}", fn.fd)
        for p in probes
        for name, fn in p.bpf.funcs.items()  # type: ignore[attr-defined]
    ]


def empty_fd(bpf: Any) -> int:
    return int(next(iter(bpf.funcs.values())).fd)


@contextlib.contextmanager
def bpf_stats_enabled() -> Iterator[None]:
    """kernel.bpf_stats_enabled on for the block (it costs two clock reads per program run,
    so slowdowns are measured with it off), restored after."""
    old = BPF_STATS.read_text().strip()
    BPF_STATS.write_text("1")
    try:
        yield
    finally:
        BPF_STATS.write_text(old)


@dataclass(slots=True)
class Attached:
    """Probes attached for a phase, polled and ticked from the bench's own loop."""

    watch: WatchSpec
    events: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    probes: ProbeSet | None = None
    start_wall_s: float = 0.0
    start_cpu_s: float = 0.0
    rss_mb: float = 0.0  # resident after start (the compiler's peak is gone by then)

    def emit(self, ev: Event) -> bool:
        self.events += 1
        self.kinds[ev.KIND] = self.kinds.get(ev.KIND, 0) + 1
        return True

    def __enter__(self) -> Attached:
        t0, c0 = time.monotonic(), cpu_seconds()
        self.probes = ProbeSet(PROBES, topology=load_topology(), watch=self.watch, emit=self.emit)
        statuses = self.probes.start()
        self.start_wall_s, self.start_cpu_s = time.monotonic() - t0, cpu_seconds() - c0
        self.rss_mb = rss_mb()
        bad = [s for s in statuses if s.state != "running"]
        if bad:
            raise SystemExit(f"probe not running: {bad}")
        return self

    def run(self, proc: subprocess.Popen[str]) -> Run:
        """Release the workload and keep the probes polled (50 ms) and ticked (1 s) until it
        ends, as the daemon would."""
        assert self.probes is not None
        self.probes.core.refresh(time.monotonic_ns())  # watch it now, not at the next tick
        release(proc)
        last_tick = time.monotonic()
        while (run := reap(proc, wait=False)) is None:
            time.sleep(0.05)
            self.probes.poll()
            if time.monotonic() - last_tick >= 1:
                last_tick = time.monotonic()
                self.probes.tick(time.monotonic_ns())
        self.probes.poll()
        return run

    def __exit__(self, *exc: object) -> None:
        if self.probes is not None:
            self.probes.close()


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@contextlib.contextmanager
def detached(probes: list[Probe]) -> Iterator[None]:
    """The probes' tracepoints detached for the block, their programs and maps kept, so that
    runs without probes interleave with runs with them (the machine's load drifts)."""
    views = [p.bpf for p in probes]  # type: ignore[attr-defined]  # their part views
    raw = [(view, event) for view in views for event in list(view.raw_tracepoint_fds)]
    tracepoints = [(view, tp) for view in views for tp in list(view.tracepoint_fds)]
    for view, event in raw:
        view.detach_raw_tracepoint(tp=event)
    for view, tp in tracepoints:
        view.detach_tracepoint(tp)
    try:
        yield
    finally:
        for view, event in raw:
            view.attach_raw_tracepoint(tp=event, fn_name=f"raw_tracepoint__{event}")
        for view, tp in tracepoints:
            view.attach_tracepoint(tp=tp, fn_name="tracepoint__" + tp.replace(":", "__"))


def measure(workload: Workload, reps: int) -> dict[str, Any]:
    """Per op, in each mode (probes detached, watching the workload, attached but watching
    another program), interleaved rep by rep: elapsed time, and CPU time of the workload's
    processes (where the probes run when it switches out; other work sharing the CPUs moves
    it less than elapsed time). Slowdowns compare medians."""
    runs: dict[str, list[Run]] = {"off": [], "watched": [], "unwatched": []}
    with Attached(workload.watch()) as on:
        assert on.probes is not None
        for _ in range(reps):
            with detached(on.probes.probes):
                runs["off"].append(finish(workload.start()))
            runs["watched"].append(on.run(workload.start()))
            runs["unwatched"].append(on.run(workload.start(unwatched=True)))

    def median(mode: str, what: str) -> float:
        return statistics.median(getattr(r, what) for r in runs[mode]) / workload.ops

    out: dict[str, Any] = {"workload": workload.name, "ops": workload.ops}
    for what in ("elapsed_ns", "cpu_ns"):
        base = median("off", what)
        out[f"{what}_per_op_off"] = base
        off = [getattr(r, what) / workload.ops for r in runs["off"]]
        out[f"{what}_spread_off"] = (max(off) - min(off)) / base  # the noise to judge by
        for mode in ("watched", "unwatched"):
            out[f"{what}_slowdown_{mode}"] = median(mode, what) / base - 1
    out["runs"] = {mode: [dataclasses.asdict(r) for r in rs] for mode, rs in runs.items()}
    return out


def kernel_cost(workload: Workload, watched: bool) -> dict[str, Any]:
    """In-kernel ns per program run over one run, from the kernel's BPF statistics; also
    what Python received and spent."""
    from bcc import BPF

    watch = workload.watch() if watched else WatchSpec(pids={1})
    with bpf_stats_enabled(), Attached(watch) as on:
        assert on.probes is not None
        proc = workload.start()
        # What the statistics charge a program that does nothing (their own clock reads).
        empty = BPF(text=b"TRACEPOINT_PROBE(sched, sched_switch) { return 0; }")
        stats = [*prog_stats(on.probes.probes), ProgStats("empty:sched_switch", empty_fd(empty))]
        before = {s.name: s.read() for s in stats}
        c0, t0, e0 = cpu_seconds(), time.monotonic(), on.events
        run = on.run(proc)
        wall, cpu = time.monotonic() - t0, cpu_seconds() - c0
        per_prog = {}
        for s in stats:
            cnt, ns = (a - b for a, b in zip(s.read(), before[s.name], strict=True))
            per_prog[s.name] = {"runs": cnt, "ns_per_run": ns / cnt if cnt else 0.0}
        empty.cleanup()
        # The probes' own time per op: each program's runs, less what the statistics charge
        # a program that does nothing.
        baseline = per_prog["empty:sched_switch"]["ns_per_run"]
        probe_ns = sum(
            p["runs"] * max(0.0, p["ns_per_run"] - baseline)
            for name, p in per_prog.items()
            if not name.startswith("empty:")
        )
        return {
            "workload": workload.name,
            "watched": watched,
            "programs": per_prog,
            "probe_ns_per_op": probe_ns / workload.ops,
            "probe_share_of_op": probe_ns / run.elapsed_ns,
            "events_to_python_per_s": (on.events - e0) / wall,
            "python_cpu_share": cpu / wall,
            "start_wall_s": on.start_wall_s,
            "start_cpu_s": on.start_cpu_s,
            "rss_mb": on.rss_mb,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }


def report(results: dict[str, Any]) -> str:
    lines = ["workload        measure     per op (off)  watched  unwatched  spread(off)"]
    for r in results["slowdown"]:
        for what in ("elapsed_ns", "cpu_ns"):
            lines.append(
                f"{r['workload']:<15} {what[:-3]:<10} {r[f'{what}_per_op_off']:>10.0f} ns"
                f" {r[f'{what}_slowdown_watched']:>+8.1%} {r[f'{what}_slowdown_unwatched']:>+10.1%}"
                f" {r[f'{what}_spread_off']:>11.0%}"
            )
    for k in results["kernel"]:
        watched = "watched" if k["watched"] else "not watched"
        lines.append(f"\nin-kernel ns per run, {k['workload']} ({watched}):")
        for name, p in sorted(k["programs"].items()):
            lines.append(f"  {name:<45} {p['ns_per_run']:>7.1f} ns  x {p['runs']}")
        lines.append(
            f"  probes: {k['probe_ns_per_op']:.0f} ns per op in the kernel, net of the"
            f" statistics' own cost: {k['probe_share_of_op']:.2%} of the run"
        )
        lines.append(
            f"  python: {k['events_to_python_per_s']:.0f} events/s,"
            f" {k['python_cpu_share']:.1%} of a CPU; start {k['start_wall_s']:.2f} s wall,"
            f" {k['start_cpu_s']:.2f} s CPU; RSS {k['rss_mb']:.0f} MB after start,"
            f" {k['max_rss_mb']:.0f} MB peak"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9, help="runs per mode (default 9)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--kernel-only", action="store_true", help="only the in-kernel cost, no slowdowns"
    )
    parser.add_argument(
        "--workloads", help="comma-separated names (default: all three)", default=""
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench.sched_cstate: run as root (it attaches BPF probes)")
    with tempfile.TemporaryDirectory(prefix="gj-bench-") as tmp:
        where = Path(tmp)
        pingpong = compile_c(PINGPONG_C, "gj-pingpong", where)
        feeder = compile_c(FEEDER_C, "gj-feeder", where)
        work = calibrate_work(feeder, 1_000_000)
        workloads = [
            Workload("pingpong-2cpu", pingpong, ("100000", "0", "1"), 100_000),
            Workload("pingpong-1cpu", pingpong, ("100000", "1", "1"), 100_000),
            Workload("feeder-1ms", feeder, ("1000", str(work), "100000"), 1000),
        ]
        if args.workloads:
            workloads = [w for w in workloads if w.name in args.workloads.split(",")]
        results = {
            "slowdown": [] if args.kernel_only else [measure(w, args.reps) for w in workloads],
            "kernel": [kernel_cost(w, watched) for w in workloads for watched in (True, False)],
        }
    print(json.dumps(results, indent=2) if args.json else report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
