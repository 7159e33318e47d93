"""What the python_stacks probe costs, measured as root: a Python process running a pure-Python
loop on one thread (always running, so sampled at every tick: the worst case per thread),
with the probe sampling it and not (its sample budget set to none and back: the sampler
still wakes every period), round by round with the order flipping each round so that drift
in the VM cancels out. Reports the loop's CPU time per iteration off and on and their ratio
(what the job loses: the reads do not stop it, so only cache and memory-bus effects can
show), and the sampler thread's own CPU time per sample and per second (what gpujitter
spends).
Then the scaling: N watched Python processes each spinning in Python (all of them always
runnable: data-loader workers at full load), for each N in --busy, the sampler thread's CPU
share of one CPU and the samples it took per second over --window seconds.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.python_stacks_cost --rounds 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpujitter.probes.python_stacks import PythonStacksProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

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


BUSY = "def spin():\n    while True:\n        pass\nprint(flush=True)\nspin()\n"


def ask(child: subprocess.Popen[str], iterations: int) -> int:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"loop {iterations}\n")
    child.stdin.flush()
    return int(json.loads(child.stdout.readline())["ns"])


def sampler_cpu_ns(probe: PythonStacksProbe) -> int:
    assert probe._thread is not None and probe._thread.ident is not None
    return time.clock_gettime_ns(time.pthread_getcpuclockid(probe._thread.ident))


def scaling(busy: int, window_s: float) -> dict[str, float]:
    """The sampler's CPU share and samples/s with `busy` always-runnable Python processes."""
    procs = [
        subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
        for _ in range(busy)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            p.stdout.readline()
        with ProbeSet(
            ["python_stacks"], topology=load_topology(),
            watch=WatchSpec(pids={p.pid for p in procs}), emit=lambda ev: True,
        ) as probes:  # fmt: skip
            probes.start()
            probe = next(p for p in probes.probes if isinstance(p, PythonStacksProbe))
            while len(probe.interpreters) < busy:  # the scan looks at new processes each second
                time.sleep(0.2)
                probes.tick(time.monotonic_ns())
            time.sleep(1.0)  # thread lists read, files opened
            probes.poll()
            samples0, cpu0, t0 = probe.samples, sampler_cpu_ns(probe), time.monotonic_ns()
            end = t0 + int(window_s * 1e9)
            while time.monotonic_ns() < end:
                time.sleep(0.05)
                probes.poll()
            elapsed_s = (time.monotonic_ns() - t0) / 1e9
            cpu_s = (sampler_cpu_ns(probe) - cpu0) / 1e9
            return {
                "busy_processes": busy,
                "sampler_cpu_share": round(cpu_s / elapsed_s, 4),
                "samples_per_s": round((probe.samples - samples0) / elapsed_s, 1),
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
    per_sample: list[float] = []
    per_s: list[float] = []
    with ProbeSet(
        ["python_stacks"], topology=load_topology(), watch=WatchSpec(pids={child.pid}),
        emit=lambda ev: True,
    ) as probes:  # fmt: skip
        probes.start()
        probe = next(p for p in probes.probes if isinstance(p, PythonStacksProbe))
        ask(child, args.iterations // 10)  # warm-up
        assert probe.interpreters, f"python_stacks found no interpreter: {probe.reason}"
        spacing_ns = probe.spacing_ns
        for r in range(args.rounds):
            for state in (False, True) if r % 2 == 0 else (True, False):
                probe.spacing_ns = spacing_ns if state else 1 << 62  # off: no sample budget
                samples0, cpu0, t0 = (
                    probe.samples + len(probe._queue),
                    sampler_cpu_ns(probe),
                    time.monotonic_ns(),
                )
                ns = ask(child, args.iterations)
                probes.poll()
                taken = probe.samples - samples0
                (on if state else off).append(ns / args.iterations)
                if state and taken:
                    cpu = sampler_cpu_ns(probe) - cpu0
                    per_sample.append(cpu / taken)
                    per_s.append(cpu / ((time.monotonic_ns() - t0) / 1e9))
        reason = probe.reason
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=30)
    result: dict[str, Any] = {
        "probe": reason,
        "period_ms": 10,
        "ns_per_iteration_off": round(statistics.median(off), 3),
        "ns_per_iteration_on": round(statistics.median(on), 3),
        "ratio_on_off": round(statistics.median(on) / statistics.median(off), 4),
        "sampler_us_per_sample": round(statistics.median(per_sample) / 1e3, 1),
        "sampler_cpu_share_per_running_thread": round(statistics.median(per_s) / 1e9, 4),
        "scaling": [scaling(int(n), args.window) for n in args.busy.split(",") if n],
        "off_all": off,
        "on_all": on,
    }
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_all")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
