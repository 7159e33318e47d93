"""Where the probe thread's time goes, call by call: the default set (or --probes) run by a
ProbeThread watching a process, each poll and tick of the set and each probe's own poll,
sample and lost_kernel timed in thread CPU time over a window; and how many windows irq's
sweep read against how many it delivered. No daemon: only the thread that drains the rings
and reads the in-kernel aggregates.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.probe_thread [--seconds 15]
        [--settle S] [--pid PID] [--probes LIST] [--rounds N] [--before DIR] [--json]

--pid: the watched process (default: this process's parent, usually an idle shell).
--rounds N runs N windows, each in a fresh process; --before DIR alternates them with the
package laid out in DIR (another tree, bench/__init__.py), N of each, beside the same process.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench import alternated
from gpujitter.probes import registry
from gpujitter.probes.events import IrqStolen
from gpujitter.probes.irq import IrqProbe
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.runner import ProbeSet, ProbeThread
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import CoreBpf, WatchSpec

# Per class, the methods timed where the class itself defines them (an inherited one is
# timed once, under the class that defines it).
TIMED = {
    ProbeSet: ("poll", "tick", "measure_cost"),
    CoreBpf: ("poll", "refresh"),
    Log2Map: ("delta",),  # the histograms' share of the probes' samples
}
PER_PROBE = ("poll", "sample", "lost_kernel")


def time_calls(cls: type, name: str, spent: dict[str, list[int]]) -> None:
    original: Callable[..., Any] = cls.__dict__[name]
    label = f"{cls.__name__}.{name}"

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label].append(time.thread_time_ns() - start)

    setattr(cls, name, timed)


def count_calls(cls: type, name: str, counts: dict[str, int]) -> None:
    """Count calls only (a clock read around each would cost more than some calls do)."""
    original: Callable[..., Any] = cls.__dict__[name]
    label = f"{cls.__name__}.{name}"

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[label] += 1
        return original(*args, **kwargs)

    setattr(cls, name, counted)


def measure(names: list[str], pid: int, seconds: float, settle: float = 0.0) -> dict[str, Any]:
    spent: dict[str, list[int]] = defaultdict(list)
    # Each window irq's sweep looks up is decoded (whether delivered or not, on trees where
    # the sweep drops those below the threshold after reading them).
    counts: dict[str, int] = defaultdict(int)
    count_calls(IrqProbe, "decode", counts)
    classes: dict[type, tuple[str, ...]] = dict(TIMED)
    for name in names:
        spec = registry.get(name)
        for cls in type(spec.factory(spec)).__mro__:
            classes.setdefault(cls, PER_PROBE)
    for cls, methods in classes.items():
        for method in methods:
            if method in cls.__dict__:
                time_calls(cls, method, spent)
    events: list[Any] = []
    watch = WatchSpec(pids={pid})
    with ProbeThread(names, topology=load_topology(nvml=False), watch=watch, emit=events.append):
        # what a probe does once (reading a new process's maps, its libraries' symbols, its
        # Python code objects) comes in the first seconds after the start
        time.sleep(settle)
        spent.clear()
        counts.clear()
        delivered = len(events)
        time.sleep(seconds)
        windows = [ev for ev in events[delivered:] if isinstance(ev, IrqStolen)]
        delivered = len(events) - delivered
        read = counts["IrqProbe.decode"]
    return {
        "seconds": seconds,
        "settle_s": settle,
        "events_per_s": delivered / seconds,
        "irq_windows_read_per_s": read / seconds,
        "irq_windows_delivered_per_s": len(windows) / seconds,
        "calls": {
            label: {
                "n": len(ns),
                "mean_us": sum(ns) / len(ns) / 1e3,
                "ms_per_s": sum(ns) / seconds / 1e6,
            }
            for label, ns in sorted(spent.items(), key=lambda kv: -sum(kv[1]))
        },
    }


def in_rounds(args: argparse.Namespace) -> list[dict[str, Any]]:
    """args.rounds windows of this tree (and as many of args.before's, in turns: before,
    this, this, before, ...), each a child run of this bench; each result names its tree."""
    argv = ["--pid", str(args.pid), "--seconds", str(args.seconds), "--settle", str(args.settle)]
    argv += ["--probes", args.probes] if args.probes else []
    runs = alternated("bench.probe_thread", argv, args.before, args.rounds)
    return [{"tree": tree, **result} for tree, result in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds after the start before the window opens")  # fmt: skip
    parser.add_argument("--pid", type=int, default=os.getppid())
    parser.add_argument("--probes", default="", help="comma-separated (default: the default set)")
    parser.add_argument("--rounds", type=int, default=1, help="windows, each in a fresh process")
    parser.add_argument("--before", metavar="DIR", default="",
                        help="alternate rounds with the package laid out there")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = args.probes.split(",") if args.probes else registry.select([], [])
    if args.rounds > 1 or args.before:
        rounds = in_rounds(args)
        if args.json:
            print(json.dumps(rounds, indent=1))
            return
        for r in rounds:
            calls = r["calls"]
            per_s = {k: c["ms_per_s"] for k, c in calls.items()}
            print(f"{r['tree']:<24} {r['events_per_s']:6.0f} events/s  poll "
                  f"{per_s.get('ProbeSet.poll', 0):5.2f}  tick {per_s.get('ProbeSet.tick', 0):5.2f}"
                  " ms per s")  # fmt: skip
        return
    res = measure(names, args.pid, args.seconds, args.settle)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print(f"{', '.join(names)}: {res['events_per_s']:.0f} events/s over {args.seconds:.0f} s")
    print(
        f"irq windows: {res['irq_windows_read_per_s']:.0f}/s read by the sweep, "
        f"{res['irq_windows_delivered_per_s']:.0f}/s delivered"
    )
    print(f"{'call':<28} {'calls':>6} {'mean µs':>9} {'ms per s':>9}")
    for label, c in res["calls"].items():
        print(f"{label:<28} {c['n']:>6} {c['mean_us']:>9.0f} {c['ms_per_s']:>9.2f}")
    print("(ProbeSet.poll and .tick include the probes' calls below them)")


if __name__ == "__main__":
    main()
