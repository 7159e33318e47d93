"""Attribution time per gap, and what following wakers costs: a recorded trace (default: the
loader drill's, where a wait is followed three wakers down into a worker process) with
waker following off and at the default budget; then a worst case, a chain of 32 threads
each woken by the next and each with 200 intervals in the gap, at the default budget and
with none, to show the budget bounds it.

    .venv/bin/python -m bench.attribution_cost [TRACE]
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from gpujitter.daemon.analysis.engine import Engine, EngineConfig
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.sinks.trace import TraceReader
from gpujitter.probes.events import Event, NodeTime, OffCpu
from gpujitter.probes.topology import Topology

FIXTURE = Path(__file__).parents[1] / "tests" / "fixtures" / "chains" / "loader-stub.gjtrace"
REPEAT = 50
MS = 1_000_000
FUTEX = 202


def per_gap_us(events: list[Event], gaps: list[GpuGap], topology: Topology,
               config: EngineConfig) -> list[float]:  # fmt: skip
    """Median time of one engine.attribute(gap) per gap, all events fed first."""
    engine = Engine(topology, config)
    for ev in events:
        engine.feed(ev)
    out = []
    for gap in gaps:
        runs = []
        for _ in range(REPEAT):
            t0 = time.perf_counter_ns()
            engine.attribute(gap)
            runs.append(time.perf_counter_ns() - t0)
        out.append(statistics.median(runs) / 1000)
    return out


def recorded(path: Path) -> None:
    with TraceReader(path) as reader:
        header, events = reader.header, list(reader)
    config = AnalysisConfig.from_record(header.analysis)
    found = list(analyse(events, header.topology, config))
    gaps = [g for g in found if isinstance(g, GpuGap)]
    attrs = [a for a in found if isinstance(a, Attribution)]
    hops = max((t.hops for a in attrs for t in a.threads), default=0)
    print(f"{path.name}: {len(events)} events, {len(gaps)} gaps, deepest waker {hops} hops")
    for name, budget in (("following off", 0), ("default budget", config.engine.waker_budget)):
        us = per_gap_us(events, gaps, header.topology, replace(config.engine, waker_budget=budget))
        print(
            f"  {name:<15} per gap: median {statistics.median(us):8.1f} us, max {max(us):8.1f} us"
        )


def worst_case(threads: int = 32, intervals: int = 200) -> None:
    """A 1 s gap; thread k+1 wakes thread k; each thread's gap is `intervals` waits for the
    next, each followed by on-CPU time."""
    base = 10**12
    events: list[Event] = []
    step = 1000 * MS // intervals
    for k in range(threads):
        tid = 100 + k
        for i in range(intervals):
            start = base + i * step
            woken = start + step * 3 // 4
            events.append(OffCpu(ts_ns=start, end_ns=woken, tid=tid, tgid=100, cpu=0, cpu_in=0,
                                 state="sleeping", runnable_ns=woken, waker_tid=tid + 1,
                                 syscall=FUTEX, comm=f"t{k}"))  # fmt: skip
        events.append(NodeTime(ts_ns=base, interval_ns=1000 * MS, tid=tid, tgid=100,
                               node_ns=((0, 250 * MS),)))  # fmt: skip
    gap = GpuGap(ts_ns=base, end_ns=base + 1000 * MS, gpu=0, sources=("cuda",),
                 resolution_ns=2000, confidence=0.9, tgids=(100,), tid_after=100)  # fmt: skip
    topology = Topology(cpu_node={0: 0})
    print(f"worst case: {threads} threads in a chain, {intervals} waits each in a 1 s gap")
    for name, budget in (("default budget", EngineConfig().waker_budget), ("no budget", 10**9)):
        config = EngineConfig(waker_budget=budget)
        (us,) = per_gap_us(events, [gap], topology, config)
        engine = Engine(topology, config)
        for ev in events:
            engine.feed(ev)
        attr = engine.attribute(gap)
        hops = max(t.hops for t in attr.threads)
        print(f"  {name:<15} per gap: {us / 1000:8.1f} ms, deepest waker {hops} hops")


def main() -> None:
    recorded(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE)
    worst_case()


if __name__ == "__main__":
    main()
