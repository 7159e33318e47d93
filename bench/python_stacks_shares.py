"""Whether python_stacks' shared budget samples busy Python processes in proportion to their
CPU time, measured as root: N always-busy processes (more periods than the budget has
samples), optionally pinned one alone on CPU 0 and the others on CPU 1 (unequal CPU), for
--rounds rounds of --seconds each with the records drained every 100 ms. Per round: each
process's samples and CPU time, samples/s in all, and the chi-square tail of the counts
against shares by CPU time (tests/proportion.py; near 0: not proportional).

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.python_stacks_shares --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.python_stacks_cost import BUSY
from gpujitter.probes.events import PySample
from gpujitter.probes.python_stacks import PythonStacksProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from tests.proportion import proportional_tail


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def rounds(procs: list[subprocess.Popen[str]], count: int, seconds: float) -> list[dict]:
    took: list[PySample] = []
    pids = [p.pid for p in procs]
    out = []
    with ProbeSet(
        ["python_stacks"], topology=load_topology(), watch=WatchSpec(pids=set(pids)),
        emit=lambda ev: took.append(ev) if isinstance(ev, PySample) else None,
    ) as probes:  # fmt: skip
        probes.start()
        probe = next(p for p in probes.probes if isinstance(p, PythonStacksProbe))
        while len(probe.interpreters) < len(procs):  # the scan looks once a second
            time.sleep(0.2)
            probes.tick(time.monotonic_ns())
        for _ in range(count):
            probes.poll()
            took.clear()
            t0, cpu0 = time.monotonic_ns(), [cpu_ns(p) for p in pids]
            for _ in range(int(seconds * 10)):
                time.sleep(0.1)
                probes.poll()
            elapsed_s = (time.monotonic_ns() - t0) / 1e9
            cpu = [cpu_ns(p) - c for p, c in zip(pids, cpu0, strict=True)]
            counts = [sum(1 for s in took if s.tgid == p) for p in pids]
            out.append({
                "samples": counts,
                "cpu_ms": [c // 1_000_000 for c in cpu],
                "samples_per_s": round(sum(counts) / elapsed_s, 1),
                "tail": proportional_tail(counts, cpu) if len(counts) % 2 == 0 else None,
            })  # fmt: skip
            print(json.dumps(out[-1]), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pinned", action="store_true", help="one alone on CPU 0, the rest on 1")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    procs = [
        subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
        for _ in range(args.procs)
    ]
    try:
        for i, p in enumerate(procs):
            assert p.stdout is not None
            p.stdout.readline()
            if args.pinned:
                os.sched_setaffinity(p.pid, {0 if i == 0 else 1})
        result = {"pinned": args.pinned, "rounds": rounds(procs, args.rounds, args.seconds)}
    finally:
        for p in procs:
            p.kill()
            p.wait()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
