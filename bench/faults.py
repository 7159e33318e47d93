"""Cost of the faults and swap probes on a page-fault-heavy loop (mmap, first touch of every
page, munmap), measured in one run: the loop with no probes, with the probes attached and the
loop's process watched (every fault takes the full path), attached but unwatched (what every
other process of the node pays), and with empty programs on the same per-fault hooks (the
exception raw tracepoints: what the hooks cost before the probe does anything); plus the
probes' in-kernel time per program run (kernel.bpf_stats_enabled, switched on only for its
own round), events delivered to Python per second, and start-up time (compile and attach).

The probes are compiled once and their hooks attached and detached between loops: a
compile just before a loop slows it for reasons of its own (measured here: +9 % on the
unwatched loop, against +4.5 % with the hooks toggled).

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.faults [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import operator
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujitter.probes.events import Event, FaultStats, MajorFault, MinorFaults
from gpujitter.probes.faults import ENTRY_HOOKS, PERF_HOOKS, FaultProbe
from gpujitter.probes.progstats import loaded_prog_stats
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

# The loop: `loops` times, map `mib` MiB, touch every 4 KiB page, unmap. It waits for a line
# on stdin first, so that it can be watched before its first fault, and prints the minor
# faults and nanoseconds of the loop.
FAULT_LOOP = """
import ctypes, json, mmap, resource, sys, time
mib, loops = int(sys.argv[1]), int(sys.argv[2])
size = mib << 20
def once():
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    buf = (ctypes.c_char * size).from_buffer(m)
    ctypes.memset(buf, 1, size)
    del buf
    m.close()
once()
def cpu_ns(usage):
    return int((usage.ru_utime + usage.ru_stime) * 1e9)
sys.stdin.readline()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter_ns()
for _ in range(loops):
    once()
t1, r1 = time.perf_counter_ns(), resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"faults": r1.ru_minflt - r0.ru_minflt, "ns": t1 - t0,
                  "cpu_ns": cpu_ns(r1) - cpu_ns(r0)}))
"""


# The watched loop runs under this program name (a link to the interpreter), so that the
# probes, attached once, watch it from its exec on.
WATCHED_NAME = "gj-fault-loop"


class Loop:
    """One run of the loop in a child process, started now and released by `run`."""

    def __init__(self, mib: int, loops: int, program: Path | None = None) -> None:
        self.child = subprocess.Popen(
            [str(program or sys.executable), "-c", FAULT_LOOP, str(mib), str(loops)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.seconds = 0.0

    def run(self) -> float:
        """Release the loop; the CPU time it took per fault in ns (fault, page clearing,
        memset, unmap). CPU time, not wall time: other work on the machine does not count
        in it, except through the caches."""
        out, _ = self.child.communicate("go\n", timeout=600)
        result = json.loads(out)
        self.seconds = result["ns"] / 1e9
        return float(result["cpu_ns"]) / result["faults"]


# The per-fault raw tracepoints, by the name bcc attaches them under, and their programs.
RAW_ENTRIES = [(t.partition(":")[2], f"raw_tracepoint__{t.partition(':')[2]}") for t in ENTRY_HOOKS]


class Hooks:
    """Raw tracepoints and perf events of a loaded bcc object, attached and detached
    without recompiling."""

    def __init__(self, bpf: Any, raw: list[tuple[str, str]], perf: list[tuple[int, str]]) -> None:
        self.bpf, self.raw, self.perf = bpf, raw, perf

    def on(self) -> None:
        from bcc import PerfType

        for tp, fn in self.raw:
            self.bpf.attach_raw_tracepoint(tp=tp.encode(), fn_name=fn.encode())
        for config, fn in self.perf:
            self.bpf.attach_perf_event(
                ev_type=PerfType.SOFTWARE, ev_config=config, fn_name=fn, sample_period=1
            )

    def off(self) -> None:
        from bcc import PerfType

        for tp, _ in self.raw:
            self.bpf.detach_raw_tracepoint(tp=tp.encode())
        for config, _ in self.perf:
            self.bpf.detach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=config)


@dataclass
class Session:
    probes: ProbeSet
    startup_wall_s: float
    startup_cpu_s: float

    @property
    def hooks(self) -> Hooks:
        probe = next(p for p in self.probes.probes if isinstance(p, FaultProbe))
        perf = [(config, fn) for _, config, fn in PERF_HOOKS]
        return Hooks(probe.joined.bpf, RAW_ENTRIES, perf)

    def histograms(self) -> dict[str, list[int]]:
        return next(p for p in self.probes.probes if isinstance(p, FaultProbe)).histograms()


@contextlib.contextmanager
def attached(watch: WatchSpec, events: list[Event]) -> Iterator[Session]:
    """faults and swap attached (default thresholds), polled by a thread of their own."""
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    with ProbeSet(
        ["faults", "swap"], topology=load_topology(), watch=watch, emit=events.append
    ) as probes:
        broken = [s for s in probes.start() if s.state != "running"]
        if broken:
            raise SystemExit(f"probes did not start: {broken}")
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
        session = Session(probes, time.monotonic() - wall0, cpu_s)
        stop = threading.Event()
        poller = threading.Thread(target=probes.run, args=(stop.is_set,))
        poller.start()
        try:
            yield session
        finally:
            stop.set()
            poller.join()


@contextlib.contextmanager
def empty_programs() -> Iterator[Hooks]:
    """Programs that do nothing, on the per-fault raw tracepoints the faults probe uses: what
    the hooks cost before the probe does any work (and, in kernel BPF statistics, what the
    measurement itself costs per run). Detached to start with."""
    from bcc import BPF

    bpf = BPF(
        text="".join(f"RAW_TRACEPOINT_PROBE({tp}) {{ return 0; }}\n" for tp, _ in RAW_ENTRIES)
    )
    hooks = Hooks(bpf, RAW_ENTRIES, [])
    hooks.off()
    try:
        yield hooks
    finally:
        bpf.cleanup()


def program_stats(probe_bpf: Any, empty_bpf: Any) -> dict[str, tuple[int, int]]:
    """run_cnt and run_time_ns of each program of the probes' object and of the empty one
    (whose programs have the same names: theirs as empty:NAME)."""
    out = {}
    for prefix, bpf in (("", probe_bpf), ("empty:", empty_bpf)):
        for name, st in loaded_prog_stats(bpf).items():
            out[prefix + name] = (st.run_cnt, st.run_time_ns)
    return out


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    path = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = path.read_text()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(old)


def per_run(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, dict[str, int]]:
    out = {}
    for name, (runs0, ns0) in before.items():
        runs, ns = after[name][0] - runs0, after[name][1] - ns0
        out[name] = {"runs": runs, "ns_per_run": round(ns / runs) if runs else 0}
    return out


def measure(rounds: int, mib: int, loops: int) -> dict[str, Any]:
    """Rounds of: the loop alone; with the probes' hooks on, the loop watched and another
    not (in alternating order); with empty programs on the same hooks; alone again. Then one
    round with kernel BPF statistics on."""
    modes: dict[str, list[float]] = {m: [] for m in ("watched", "unwatched", "empty_hooks")}
    baseline: list[float] = []
    events: list[Event] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        attached(WatchSpec(comms=[WATCHED_NAME]), events) as session,
        empty_programs() as empty,
    ):
        program = Path(tmp) / WATCHED_NAME
        program.symlink_to(os.path.realpath(sys.executable))

        def watched_loop() -> Loop:
            loop = Loop(mib, loops, program)
            time.sleep(0.3)  # its exec reaches the probes, which watch it from then on
            return loop

        probes = session.hooks
        probes.off()
        for n in range(rounds):
            before = Loop(mib, loops).run()
            target, other = watched_loop(), Loop(mib, loops)
            probes.on()
            for loop in (target, other) if n % 2 else (other, target):
                modes["watched" if loop is target else "unwatched"].append(loop.run())
            probes.off()
            empty.on()
            modes["empty_hooks"].append(Loop(mib, loops).run())
            empty.off()
            baseline.append((before + Loop(mib, loops).run()) / 2)

        target, other = watched_loop(), Loop(mib, loops)
        probes.on()
        empty.on()
        with bpf_stats():
            before_stats = program_stats(probes.bpf, empty.bpf)
            target.run()
            during = program_stats(probes.bpf, empty.bpf)
            other.run()
            after = program_stats(probes.bpf, empty.bpf)
        empty.off()
        minor = session.histograms()["minor"]
    mine = [e for e in events if getattr(e, "tgid", None) == target.child.pid]
    if not mine:
        raise SystemExit("the watched loop was not seen: no events for it")

    base = min(baseline)
    return {
        "loop": {"mib": mib, "loops": loops, "rounds": rounds},
        "ns_per_fault": {"baseline": summary(baseline)}
        | {mode: summary(costs) for mode, costs in modes.items()},
        # Each round's loops ran back to back, so their ratio cancels the machine's drift;
        # the median over rounds and the ratio of the best loops both say how much slower.
        "slowdown_pct": {
            mode: {
                "median_of_rounds": pct(statistics.median(map(operator.truediv, costs, baseline))),
                "best_to_best": pct(min(costs) / base),
            }
            for mode, costs in modes.items()
        },
        "in_kernel_watched": per_run(before_stats, during),
        "in_kernel_unwatched": per_run(during, after),
        "events_per_s_watched": {
            kind.KIND: round(sum(isinstance(e, kind) for e in mine) / target.seconds)
            for kind in (MinorFaults, MajorFault, FaultStats)
        },
        "minor_fault_ns_log2": {2**i: n for i, n in enumerate(minor) if n},
        "startup": {
            "wall_s": round(session.startup_wall_s, 2),
            "cpu_s": round(session.startup_cpu_s, 2),
        },
    }


def pct(ratio: float) -> float:
    return round(100 * (ratio - 1), 1)


def summary(values: list[float], digits: int = 0) -> dict[str, float]:
    return {
        "min": round(min(values), digits),
        "median": round(statistics.median(values), digits),
        "max": round(max(values), digits),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="loops per mode (default 5)")
    p.add_argument("--mib", type=int, default=64, help="MiB mapped per iteration (default 64)")
    p.add_argument("--loops", type=int, default=20, help="iterations per loop (default 20)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.faults: attaching probes needs root")
    result = measure(args.rounds, args.mib, args.loops)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for section, value in result.items():
        print(f"{section}: {json.dumps(value)}")


if __name__ == "__main__":
    main()
