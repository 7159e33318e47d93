"""What the python_stacks probe costs, measured as root: a Python process running a pure-Python
loop on one thread (always running, so sampled every period: the worst case per thread), with
the probe sampling it and not (its threads' perf events disabled and enabled again), round by
round with the order flipping each round so that drift in the VM cancels out. Reports the
loop's CPU time per iteration off and on and their ratio (what the job loses: the BPF walk
runs in its thread, in the timer interrupt that ends each period), the BPF program's time
per run (kernel run-time statistics), and this process's CPU time per sample on less off
(what gpujitter's user space spends: the ring buffer's records decoded, the frames looked up).
Then the switches: a Python process ping-ponging one byte with a thread of its own over
pipes (four switches of its threads a round trip), its round trip with the threads' perf
events on and off (the task-clock timer is stopped and started at each switch of a sampled
thread). Then the scaling: N watched Python processes each spinning in Python (all of them always
runnable: data-loader workers at full load), for each N in --busy, over --window seconds with
the records consumed every 50 ms as the daemon does: this process's CPU share of one CPU
(the 50 ms loop included), the samples per second, and the BPF program's runs per second
and time per run. Then the same for one process whose only running thread has no Python
frame (a native thread spinning in C: each sample reads its user-space instruction address
and is named from the library's symbols, tests/native_spin.py), beside one spinning in
Python measured just before it, and for a feeder with no thread state at all (a program with
no Python whose one spinning thread is named a libcuda caller: sampled native-only).

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.python_stacks_cost --rounds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpujitter.probes.events import CudaCall
from gpujitter.probes.perf_event import set_enabled
from gpujitter.probes.progstats import enable_stats, prog_stats
from gpujitter.probes.python_stacks import PythonStacksProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from tests import native_spin

# The measured process: on "loop N", N iterations of Python arithmetic inside a function
# three calls deep (a frame chain to walk, as a training step has); replies with the thread's
# CPU time for them.
CHILD = """
import json, sys, time
def inner(n):
    x = 0
    for i in range(n):
        x += i * i
    return x
def middle(n):
    return inner(n)
def outer(n):
    return middle(n)
for line in sys.stdin:
    n = int(line.split()[1])
    t0 = time.thread_time_ns()
    outer(n)
    print(json.dumps({"ns": time.thread_time_ns() - t0}), flush=True)
"""


# The ping-pong: on "N", N round trips between the main thread and an echoing thread; replies
# with the mean round trip in ns.
PINGPONG = """
import os, sys, threading, time
a, b = os.pipe()
c, d = os.pipe()
def echo():
    while True:
        os.write(d, os.read(a, 1))
threading.Thread(target=echo, daemon=True).start()
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        os.write(b, b"x")
        os.read(c, 1)
    print((time.perf_counter_ns() - t0) // n, flush=True)
"""
BUSY = "def spin():\n    while True:\n        pass\nprint(flush=True)\nspin()\n"


def ask(child: subprocess.Popen[str], iterations: int) -> int:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"loop {iterations}\n")
    child.stdin.flush()
    return int(json.loads(child.stdout.readline())["ns"])


def sampling(probe: PythonStacksProbe, on: bool) -> None:
    """Enable or disable the perf events of every thread the probe samples."""
    for fd, _ in probe._sampled.values():
        set_enabled(fd, on)


@contextlib.contextmanager
def sampling_set(pids: set[int]) -> Iterator[tuple[ProbeSet, PythonStacksProbe]]:
    """python_stacks started alone on the processes `pids`, with the probe."""
    with ProbeSet(
        ["python_stacks"], topology=load_topology(), watch=WatchSpec(pids=pids),
        emit=lambda ev: True,
    ) as probes:  # fmt: skip
        probes.start()
        yield probes, next(p for p in probes.probes if isinstance(p, PythonStacksProbe))


def bpf_totals(probe: PythonStacksProbe) -> tuple[int, int]:
    """(runs, ns) of the probe's BPF program so far."""
    stats = [prog_stats(fd) for fd in probe.programs()]
    return sum(s.run_cnt for s in stats), sum(s.run_time_ns for s in stats)


def switches(rounds: int, trips: int = 20_000) -> dict[str, float]:
    """The ping-pong's round trip (µs, medians of alternating rounds) off and on."""
    child = subprocess.Popen(
        [sys.executable, "-c", PINGPONG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None

    def trip(n: int) -> int:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(f"{n}\n")
        child.stdin.flush()
        return int(child.stdout.readline())

    rtt: dict[bool, list[int]] = {False: [], True: []}
    try:
        with sampling_set({child.pid}) as (probes, probe):
            trip(trips // 10)  # warm-up; both threads exist and are sampled
            assert len(probe._sampled) == 2, f"threads sampled: {list(probe._sampled)}"
            for r in range(rounds):
                for state in (False, True) if r % 2 == 0 else (True, False):
                    sampling(probe, state)
                    rtt[state].append(trip(trips))
                    probes.poll()
    finally:
        child.kill()
        child.wait()
    off, on = (statistics.median(rtt[s]) / 1e3 for s in (False, True))
    return {"round_trip_us_off": round(off, 2), "round_trip_us_on": round(on, 2),
            "per_round_trip_us": round(on - off, 2)}  # fmt: skip


def scaling(busy: int, window_s: float) -> dict[str, float]:
    """The sampler's CPU share and samples/s with `busy` always-runnable Python processes."""
    procs = [
        subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
        for _ in range(busy)
    ]
    for p in procs:
        assert p.stdout is not None
        p.stdout.readline()
    return measured(procs, window_s) | {"busy_processes": busy}


def native(window_s: float) -> dict[str, dict[str, float]]:
    """measured() for one process whose running thread has no Python frame (its samples
    native frames), the library built in a directory of its own; then for a feeder in a
    process with no Python (native-only)."""
    with tempfile.TemporaryDirectory() as where:
        proc, _ = native_spin.start(native_spin.build(Path(where)), sys.executable)
        held = measured([proc], window_s)
        proc, feeder, _ = native_spin.start_program(native_spin.build_program(Path(where)), True)
        return {"native": held, "native_only": measured([proc], window_s, feeder)}


def measured(
    procs: list[subprocess.Popen[str]], window_s: float, feeder: int = 0
) -> dict[str, float]:
    """The sampler's CPU share, samples/s and BPF runs/s and time per run over window_s with
    the processes `procs` watched (killed at the end); feeder: a thread of procs[0] named a
    libcuda caller at every poll (0: none)."""
    pids = {p.pid for p in procs}

    def poll(probes: ProbeSet) -> None:
        if feeder:
            named = CudaCall(ts_ns=time.monotonic_ns(), dur_ns=0, tid=feeder,
                             tgid=procs[0].pid, cpu=0, api="launch", func="bench")  # fmt: skip
            probes.ctx.emit(named)
        probes.poll()

    try:
        with sampling_set(pids) as (probes, probe):
            while {pid for pid, _ in probe._sampled} < pids:  # processes found each second
                time.sleep(0.2)
                poll(probes)
                probes.tick(time.monotonic_ns())
            time.sleep(1.0)  # thread lists read, files opened
            poll(probes)
            samples0, cpu0, t0 = probe.samples, time.process_time_ns(), time.monotonic_ns()
            runs0, bpf0 = bpf_totals(probe)
            end = t0 + int(window_s * 1e9)
            while time.monotonic_ns() < end:
                time.sleep(0.05)
                poll(probes)
            elapsed_s = (time.monotonic_ns() - t0) / 1e9
            cpu_s = (time.process_time_ns() - cpu0) / 1e9
            runs, bpf_ns = (a - b for a, b in zip(bpf_totals(probe), (runs0, bpf0), strict=True))
            return {
                "user_cpu_share": round(cpu_s / elapsed_s, 4),
                "samples_per_s": round((probe.samples - samples0) / elapsed_s, 1),
                "bpf_runs_per_s": round(runs / elapsed_s, 1),
                "bpf_us_per_run": round(bpf_ns / max(1, runs) / 1e3, 2),
            }
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=10_000_000)
    parser.add_argument("--busy", default="1,4,16", help="busy process counts, comma-separated")
    parser.add_argument("--window", type=float, default=5.0, help="seconds measured per count")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    off: list[float] = []
    on: list[float] = []
    user_ns: dict[bool, list[int]] = {False: [], True: []}  # this process's CPU, per round
    taken: list[int] = []
    per_run: list[float] = []
    stats_fd = enable_stats()
    with sampling_set({child.pid}) as (probes, probe):
        ask(child, args.iterations // 10)  # warm-up
        assert probe.interpreters, f"python_stacks found no interpreter: {probe.reason}"
        for r in range(args.rounds):
            for state in (False, True) if r % 2 == 0 else (True, False):
                sampling(probe, state)
                probes.poll()
                samples0, cpu0 = probe.samples, time.process_time_ns()
                runs0, bpf0 = bpf_totals(probe)
                ns = ask(child, args.iterations)
                probes.poll()
                (on if state else off).append(ns / args.iterations)
                user_ns[state].append(time.process_time_ns() - cpu0)
                runs, bpf_ns = (
                    a - b for a, b in zip(bpf_totals(probe), (runs0, bpf0), strict=True)
                )
                if state:
                    per_run.append(bpf_ns / max(1, runs))
                    taken.append(probe.samples - samples0)
        reason, failed = probe.reason, probe.failed_reads
    if stats_fd >= 0:
        os.close(stats_fd)
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=30)
    user_per_sample = [
        (ns - statistics.median(user_ns[False])) / max(1, n)
        for ns, n in zip(user_ns[True], taken, strict=True)
    ]
    result: dict[str, Any] = {
        "probe": reason,
        "period_ms": 10,
        "ns_per_iteration_off": round(statistics.median(off), 3),
        "ns_per_iteration_on": round(statistics.median(on), 3),
        "ratio_on_off": round(statistics.median(on) / statistics.median(off), 4),
        "bpf_us_per_sample": round(statistics.median(per_run) / 1e3, 2),
        # this process's CPU in a round on, less the median round off, per sample taken
        "user_us_per_sample": round(statistics.median(user_per_sample) / 1e3, 1),
        "samples_per_round": statistics.median(taken),
        "failed_reads": failed,
        "switches": switches(args.rounds),
        "scaling": [scaling(int(n), args.window) for n in args.busy.split(",") if n],
        "native": {"python": scaling(1, args.window), **native(args.window)},
        "off_all": off,
        "on_all": on,
    }
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_all")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
