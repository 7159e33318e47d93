"""What the python_gc probe costs a Python process, measured as root: a loop that makes
only cyclic garbage (one self-referencing list per iteration, nothing else: the worst case,
a young collection every ~700 iterations and nothing else to amortise the probe over), with
the probe's markers detached and attached (their semaphores fall back to 0 and rise again),
round by round with the order flipping each round so that drift in the VM cancels out.
Reports the thread's CPU time per iteration off and on (CPU time, not wall time: on a
shared VM the wall time holds other load's run-queue waits), their ratio, the collections
per second, and the probe's cost per collection (the difference over the collections). A
second loop of explicit young collections of an empty generation gives that cost alone.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.python_gc_cost --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpujitter.probes.python_gc import PythonGcProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

# The measured process: on "cycles N", N iterations of cyclic garbage; on "collect N", N
# explicit young collections of an empty generation (the probe's cost per collection with
# little else around it); replies with the CPU time
# they took (the thread's, user and system: a uprobe trap is system time of the thread it
# hits, while time waiting for a CPU that other load holds is no part of it) and the
# collections they set off.
CHILD = """
import gc, json, sys, time
for line in sys.stdin:
    what, n = line.split()
    n = int(n)
    before = sum(s["collections"] for s in gc.get_stats())
    t0 = time.thread_time_ns()
    if what == "cycles":
        for _ in range(n):
            a = []
            a.append(a)
    else:
        for _ in range(n):
            gc.collect(0)
    ns = time.thread_time_ns() - t0
    done = sum(s["collections"] for s in gc.get_stats()) - before
    print(json.dumps({"ns": ns, "collections": done}), flush=True)
"""


def ask(child: subprocess.Popen[str], what: str, iterations: int) -> dict[str, Any]:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"{what} {iterations}\n")
    child.stdin.flush()
    return dict(json.loads(child.stdout.readline()))


def attach(probe: PythonGcProbe, on: bool) -> None:
    """Detach every marker (closing the perf events lowers the semaphores) or attach them
    again, as the probe first did."""
    for fd in probe._fds:
        os.close(fd)
    probe._fds, probe._slots = [], 0
    if on:
        for mapped, hooks in probe.interpreters.values():
            probe._attach(mapped, hooks)


def paired(probe: PythonGcProbe, child: subprocess.Popen[str], what: str, iterations: int,
           rounds: int) -> dict[str, Any]:  # fmt: skip
    """`what` with the markers detached and attached, `rounds` times, alternating the order."""
    off: list[float] = []
    on: list[float] = []
    collections: list[int] = []
    for r in range(rounds):
        for state in (False, True) if r % 2 == 0 else (True, False):
            attach(probe, state)
            reply = ask(child, what, iterations)
            (on if state else off).append(reply["ns"] / iterations)
            collections.append(reply["collections"])
    per_round = statistics.median(collections)
    diff = statistics.median(b - a for a, b in zip(off, on, strict=True))
    return {
        "iterations_per_round": iterations,
        "ns_per_iteration_off": round(statistics.median(off), 2),
        "ns_per_iteration_on": round(statistics.median(on), 2),
        "ratio_on_off": round(statistics.median(on) / statistics.median(off), 4),
        "collections_per_round": per_round,
        "collections_per_s": round(per_round / (statistics.median(off) * iterations / 1e9)),
        "probe_ns_per_collection": round(diff * iterations / max(1, per_round)),
        "off_all": off,
        "on_all": on,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=2_000_000)
    parser.add_argument("--collections", type=int, default=20_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    result: dict[str, Any] = {}
    with ProbeSet(
        ["python_gc"], topology=load_topology(), watch=WatchSpec(pids={child.pid}),
        emit=lambda ev: True,
    ) as probes:  # fmt: skip
        probes.start()
        probe = next(p for p in probes.probes if isinstance(p, PythonGcProbe))
        assert probe._fds, f"python_gc attached nothing: {probe.reason}"
        ask(child, "cycles", args.iterations // 10)  # warm-up
        result["probe"] = probe.reason
        result["cyclic_garbage"] = paired(probe, child, "cycles", args.iterations, args.rounds)
        result["empty_collections"] = paired(probe, child, "collect", args.collections, args.rounds)
        result["collections_seen_by_probe"] = probe.collections()
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=30)
    brief = {
        k: {f: x for f, x in v.items() if not f.endswith("_all")} if isinstance(v, dict) else v
        for k, v in result.items()
    }
    print(json.dumps(brief, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
