"""What the python_gil probe costs a Python process, measured as root: a thread doing small I/O
(os.stat, which releases the GIL and takes it back each call: the probe's worst case, two
uprobe hits per call and nothing to amortise them over), in two processes at once: one runs
this venv's interpreter, which the probe watches and probes, the other a copy of the same
file (another inode: no uprobe there), round by round with the order flipping each round.
Reports each one's thread CPU time per call (CPU time: a uprobe trap is system time of the
thread it hits, while waiting for a CPU that other load holds is not), the probe's cost per
GIL acquisition (the difference), the acquisitions per second of the loop, and a contended
run (a second thread holding the GIL in a pure-Python loop) for the waits streamed.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.python_gil_cost --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpujitter.probes.events import Event, GilWait
from gpujitter.probes.python_gil import PythonGilProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

# The measured process: on "calls N", N os.stat calls; on "held N", the same with a thread
# holding the GIL in a pure-Python loop meanwhile; replies with the calling thread's CPU
# time and wall time.
CHILD = """
import json, os, sys, threading, time
for line in sys.stdin:
    what, n = line.split()
    stop = []
    if what == "held":
        t = threading.Thread(target=lambda: [0 for _ in iter(lambda: bool(stop), True)])
        t.start()
    c0, w0 = time.thread_time_ns(), time.monotonic_ns()
    for _ in range(int(n)):
        os.stat("/")
    ns, wall = time.thread_time_ns() - c0, time.monotonic_ns() - w0
    if what == "held":
        stop.append(1)
        t.join()
    print(json.dumps({"ns": ns, "wall_ns": wall}), flush=True)
"""


def child(python: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [python, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def ask(proc: subprocess.Popen[str], what: str, n: int) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{what} {n}\n")
    proc.stdin.flush()
    return dict(json.loads(proc.stdout.readline()))


def paired(probe: PythonGilProbe, probed: subprocess.Popen[str], plain: subprocess.Popen[str],
           what: str, n: int, rounds: int) -> dict[str, Any]:  # fmt: skip
    """`what` in the probed and the plain process in turn, `rounds` times, the order flipping:
    CPU and wall ns per iteration each way, and the acquisitions the probed rounds made."""
    on: dict[str, list[float]] = {"ns": [], "wall_ns": []}
    off: dict[str, list[float]] = {"ns": [], "wall_ns": []}
    acquisitions = 0
    ask(probed, what, max(1, n // 10))  # warm-up
    ask(plain, what, max(1, n // 10))
    for r in range(rounds):
        for proc in (probed, plain) if r % 2 == 0 else (plain, probed):
            before = probe.acquisitions()
            reply = ask(proc, what, n)
            if proc is probed:
                acquisitions += probe.acquisitions() - before
            for key in ("ns", "wall_ns"):
                (on if proc is probed else off)[key].append(reply[key] / n)
    med = statistics.median
    return {
        "iterations_per_round": n,
        "cpu_ns_per_iteration_off": round(med(off["ns"]), 1),
        "cpu_ns_per_iteration_on": round(med(on["ns"]), 1),
        "wall_ns_per_iteration_off": round(med(off["wall_ns"]), 1),
        "wall_ns_per_iteration_on": round(med(on["wall_ns"]), 1),
        "wall_ratio_on_off": round(med(on["wall_ns"]) / med(off["wall_ns"]), 4),
        "probe_cpu_ns_per_iteration": round(
            med([b - a for a, b in zip(off["ns"], on["ns"], strict=True)]), 1
        ),
        "acquisitions_per_iteration": round(acquisitions / (n * rounds), 2),
        "off_all": off,
        "on_all": on,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--held-calls", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    python = os.path.realpath(sys.executable)
    with tempfile.TemporaryDirectory() as tmp:
        copy = shutil.copy2(python, Path(tmp) / "python-unprobed")
        probed, plain = child(python), child(copy)
        events: list[Event] = []
        with ProbeSet(
            ["python_gil"], topology=load_topology(), watch=WatchSpec(pids={probed.pid}),
            emit=lambda ev: bool(events.append(ev)) or True,
        ) as probes:  # fmt: skip
            probes.start()
            probe = next(p for p in probes.probes if isinstance(p, PythonGilProbe))
            assert "probed at take_gil" in probe.reason, probe.reason
            calls = paired(probe, probed, plain, "calls", args.calls, args.rounds)
            acquisitions_before = probe.acquisitions()
            held = ask(probed, "held", args.held_calls)
            probes.poll()
            acquisitions_held = probe.acquisitions() - acquisitions_before
        for proc in (probed, plain):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    waits = [e for e in events if isinstance(e, GilWait) and e.tgid == probed.pid]
    result: dict[str, Any] = {
        "probe": probe.reason,
        "calls": calls,
        "probe_ns_per_acquisition": round(
            calls["probe_cpu_ns_per_iteration"] / calls["acquisitions_per_iteration"], 1
        ),
        "acquisitions_per_s_off": round(1e9 / calls["wall_ns_per_iteration_off"]),
        "held": {
            "calls": args.held_calls,
            "wall_ns": held["wall_ns"],
            "acquisitions": acquisitions_held,
            "waits_streamed": len(waits),
            "waits_ns": sum(w.dur_ns for w in waits),
            "holders": sorted({w.holder_comm for w in waits}),
        },
    }
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
