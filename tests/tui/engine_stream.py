"""The one way a TUI fixture is built: a node's minute as a client of its daemon receives it,
made by the product's own code. Per GPU, the engine tests' feeding loop
(tests/fixtures/streams/feeding.py: a launch thread, stalls of known kind injected) moved
onto that GPU's CPUs, processes and names; with the node's own probe reports (CPU figures,
probe health) and NVML samples; delivered as the daemon's probes deliver, through the
daemon's runtime (its attribution engine, node state and choice of streamed records, as
embedded mode and trace replay run them). The gaps are where the loops' stalls open them;
every attribution, part, piece of evidence and remedy is the engine's: nothing here writes
one.

The stream ends as a client holds it at the daemon's first tick after the minute: the
engine still holds the gaps of the last two seconds for late events
(EngineConfig.lateness_ns), so the newest gaps show as being attributed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpujitter.daemon.analysis.engine import EngineConfig
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.service.runtime import ListSource, Runtime
from gpujitter.daemon.sinks.stream import STREAM_SCHEMA
from gpujitter.probes.events import (
    ClockRef,
    CpuStats,
    CudaCall,
    Event,
    GpuProcesses,
    GpuSample,
    NodeTime,
    ProbeStatus,
    to_record,
)
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.topology import Topology
from gpujitter.tui.feeds.streamed import StreamRecords
from tests.fixtures.streams.feeding import FUTEX, LOADER, SEC, TGID, TID, FeedingLoop
from tests.fixtures.streams.synthetic import MS, T0, TWO_NODES

MINUTE_S = 60
REALTIME_NS = 1_772_452_800 * SEC  # 2026-03-02 12:00:00 UTC at T0
PID_STEP = 10  # GPU k's process and threads: the loop's ids + k * PID_STEP
# The daemon's own footprint in each second's daemon.status (not the engine's to say).
FOOTPRINT: dict[str, Any] = {"cpu_percent": 1.2, "rss_bytes": 61 << 20, "events_per_s": 2400.0}
# Per GPU: (second of the minute, injected stall kind (feeding.STALL_CAUSE), its ms).
Plan = Mapping[int, Sequence[tuple[float, str, float]]]
Timed = tuple[int, str, Event]  # (when the probe emits it, its channel (feeding.py), the event)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one GPU's feeding loop runs on the node: the loop's CPU (tests/fixtures/streams'
    two-node numbering) -> the node's, and the loop's names (comms "trainer", "loader",
    "stress"; IRQ "nvme0q1") -> the node's. Unmapped ones stay as they are."""

    cpus: Mapping[int, int] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Node:
    """What a fixture's node is. reports: the node's own probe reports over the minute (CPU
    figures, later probe health), besides the loops' events."""

    host: str
    topology: Topology
    gpus: tuple[GpuInfo, ...]
    plan: Plan
    probes: tuple[ProbeStatus, ...]
    placements: Mapping[int, Placement] = field(default_factory=dict)
    reports: tuple[Timed, ...] = ()
    seed: int = 8


def loop_for(stalls: Sequence[tuple[float, str, float]]) -> FeedingLoop:
    """One GPU's launch thread over the minute: clean steps around each planned stall, the
    thread waiting on a futex between them."""
    loop = FeedingLoop(plan=[], topology=TWO_NODES)
    t = T0 + 10 * MS
    loop.run(T0, t)
    for at_s, kind, stall_ms in stalls:
        start = T0 + round(at_s * SEC) - 8 * MS  # the stall's gap opens ~6 ms after its launch
        loop.off(t, start, syscall=FUTEX)
        t = loop.step(start, "clean", 0)
        t = loop.step(t, kind, round(stall_ms * MS))
        t = loop.step(t, "clean", 0)
    end = T0 + MINUTE_S * SEC
    loop.off(t, end, syscall=FUTEX)
    loop.aggregate(T0, end)
    return loop


def placed(ev: Event, gpu: int, place: Placement, topology: Topology) -> Event:
    """The loop's event as GPU `gpu`'s own: its process and threads renumbered, on the
    placement's CPUs (and their nodes), with the placement's names, its gap on that GPU."""
    shift = PID_STEP * gpu
    changes: dict[str, Any] = {}
    for name in ("tid", "waker_tid", "tid_before", "tid_after"):
        if getattr(ev, name, None) in (TID, LOADER):
            changes[name] = getattr(ev, name) + shift
    if getattr(ev, "tgid", None) == TGID:
        changes["tgid"] = TGID + shift
    if isinstance(getattr(ev, "tgids", None), tuple):
        changes["tgids"] = tuple(p + shift for p in ev.tgids)  # type: ignore[attr-defined]
    if hasattr(ev, "gpu") and not isinstance(ev, CudaCall):
        changes["gpu"] = gpu
    for name in ("cpu", "cpu_in", "src_cpu", "dst_cpu"):
        if isinstance(cpu := getattr(ev, name, None), int) and cpu in place.cpus:
            changes[name] = place.cpus[cpu]
    for name, cpu_field in (("src_node", "src_cpu"), ("dst_node", "dst_cpu")):
        if name in changes or cpu_field in changes:
            changes[name] = topology.node_of(changes[cpu_field])
    if isinstance(ev, NodeTime):
        node = {TWO_NODES.node_of(a): topology.node_of(b) for a, b in place.cpus.items()}
        changes["node_ns"] = tuple((node.get(n, n), ns) for n, ns in ev.node_ns)
    for name in ("comm", "other_comm", "name"):
        if getattr(ev, name, None) in place.names:
            changes[name] = place.names[getattr(ev, name)]
    return dataclasses.replace(ev, **changes) if changes else ev  # type: ignore[type-var]


def samples(gpu: int, gaps: list[tuple[int, int]]) -> list[Timed]:
    """NVML's utilisation (200 ms) and power (100 ms) over the minute, lowered where the
    injected gaps fell (never to 0 %: the gaps are the feeding loop's, not NVML's)."""
    out: list[Timed] = []
    for metric, period in (("util", 200 * MS), ("power", 100 * MS)):
        for t in range(T0 + period, T0 + MINUTE_S * SEC + 1, period):
            idle = sum(max(0, min(t, b) - max(t - period, a)) for a, b in gaps)
            busy = 1 - idle / period
            wobble = ((t // period + gpu) % 7) / 7
            value = (
                busy * (94 + 4 * wobble) if metric == "util" else 120 + busy * (500 + 50 * wobble)
            )
            out.append((t, "gpu", GpuSample(t, gpu, metric, round(value, 1), period)))  # type: ignore[arg-type]
    return out


def each_second(
    topology: Topology, make: Callable[[int, int], CpuStats | None]
) -> tuple[Timed, ...]:
    """A per-CPU report of every second of the minute, flushed as the aggregates are:
    make(second's start ns, cpu) -> CpuStats or None."""
    out: list[Timed] = []
    for k in range(T0, T0 + MINUTE_S * SEC, SEC):
        for cpu in topology.cpus:
            if (stats := make(k, cpu)) is not None:
                out.append((k + SEC + 5 * MS, "cpustats", stats))
    return tuple(out)


def idle_halves(topology: Topology) -> tuple[Timed, ...]:
    """The cstate probe's half of each CPU's figures: half of each second in C6."""
    return each_second(topology, lambda k, cpu: CpuStats(k, SEC, cpu, idle_ns=(("C6", SEC // 2),)))


def hello(node: Node) -> dict[str, Any]:
    return {
        "type": "hello", "schema": STREAM_SCHEMA, "scope": "all", "version": "0.1.0",
        "host": node.host, "kernel": "6.18.44-gpu", "pid": 2301,
        "clock": to_record(ClockRef(ts_ns=T0, realtime_ns=REALTIME_NS)),
        "topology": node.topology.to_record(),
        "probes": [p.probe for p in node.probes],
    }  # fmt: skip


def stream(node: Node) -> list[dict[str, Any]]:
    """hello, snapshot and the minute's records, in the order a client receives them: the
    runtime's output, with the daemon.status it sends once a second."""
    merged = FeedingLoop(plan=[], topology=node.topology)
    for status in node.probes:
        merged.emit(T0, "meta", status)
    merged.emitted += node.reports
    for gpu in range(len(node.gpus)):
        loop = loop_for(node.plan.get(gpu, ()))
        place = node.placements.get(gpu, Placement())
        for at, channel, ev in loop.emitted:
            if channel != "cpustats":  # the CPUs are the node's: its reports say them
                merged.emit(at, channel, placed(ev, gpu, place, node.topology))
        pids = (TGID + PID_STEP * gpu,)
        merged.emit(T0 + 5 * MS, "gpu", GpuProcesses(T0 + 5 * MS, gpu, pids))
        merged.emitted += samples(gpu, [(i.gap_start_ns, i.gap_end_ns) for i in loop.truth])
    arrivals = merged.arrivals(seed=node.seed)
    out = StreamRecords()
    buses = {g.index: g.pci_bus_id for g in node.gpus}
    config = AnalysisConfig(engine=EngineConfig(gpu_bus_ids=buses))
    runtime = Runtime(
        ListSource([ev for _, ev in arrivals], gpus=node.gpus), node.topology, sinks=[out],
        analysis=lambda _: config, signals=False,
    )  # fmt: skip
    records = [hello(node)]
    with runtime.stepped() as step:
        state = runtime.state
        records.append(state.snapshot(T0, state.status(T0, **FOOTPRINT)))
        by_second = itertools.groupby(arrivals, key=lambda a: math.ceil((a[0] - T0) / SEC))
        for second, taken in by_second:
            step(sum(1 for _ in taken))
            records += out.take()
            if second > 0:
                at = T0 + second * SEC
                records.append(state.status(at, **FOOTPRINT).to_record())
    # Leaving the block flushed the pipeline: what it still held is past the stream's end.
    return [orjson.loads(orjson.dumps(r)) for r in records]


def ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def copy_of(built: bytes) -> list[dict[str, Any]]:
    """A stream built once (as ndjson) as records of the caller's own, free to change."""
    return [orjson.loads(line) for line in built.splitlines()]
