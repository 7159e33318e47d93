"""A minute of an eight-GPU node as the TUI receives it, produced by the product's own code:
the engine tests' feeding loop (tests/fixtures/streams/feeding.py: one launch thread per
GPU, stalls of known kind injected) delivered as the daemon's probes deliver, with NVML
samples, through the daemon's runtime (its gap detection, attribution and node state, as
embedded mode and trace replay run them). Nothing here writes a gap or an attribution.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpujitter.daemon.analysis.engine import EngineConfig
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.service.runtime import ListSource, Runtime
from gpujitter.daemon.sinks.stream import STREAM_SCHEMA
from gpujitter.probes.events import (
    ClockRef,
    CudaCall,
    Event,
    GpuProcesses,
    GpuSample,
    ProbeStatus,
)
from gpujitter.probes.nvml import GpuInfo
from gpujitter.tui.sources.streamed import StreamRecords
from tests.fixtures.streams.feeding import FUTEX, LOADER, SEC, TGID, TID, FeedingLoop
from tests.fixtures.streams.synthetic import MS, T0, TWO_NODES
from tests.tui.node_stream import ndjson

GPUS = 8
MINUTE_S = 60
BUS = [f"0000:{0x18 + 0x20 * k:02x}:00.0" for k in range(GPUS)]
TOPOLOGY = dataclasses.replace(TWO_NODES, gpu_node={bus: 0 for bus in BUS})
CONFIG = AnalysisConfig(engine=EngineConfig(gpu_bus_ids=dict(enumerate(BUS))))
# Per GPU: (second of the minute, injected stall, its ms). Spread so that every cause shows
# on some GPU's timeline and one GPU stays clean.
PLAN: dict[int, list[tuple[float, str, float]]] = {
    0: [(6.0, "swap", 30), (33.0, "malloc", 60), (51.0, "irq", 20)],
    1: [(12.5, "contention", 18), (41.5, "swap", 25)],
    2: [(19.0, "migrate", 40), (48.0, "cstate", 12)],
    3: [(27.0, "faults", 22)],
    4: [(9.5, "compute", 15), (36.0, "contention", 35), (55.0, "malloc", 20)],
    5: [],
    6: [(23.0, "irq", 30), (44.0, "loader", 28)],
    7: [(15.0, "cstate", 10), (30.0, "swap", 45), (58.0, "contention", 16)],
}


def loop_for(gpu: int) -> FeedingLoop:
    """GPU `gpu`'s launch thread over the minute: clean steps around each planned stall, the
    thread waiting on a futex between them."""
    loop = FeedingLoop(plan=[], topology=TOPOLOGY)
    t = T0 + 10 * MS
    loop.run(T0, t)
    for at_s, kind, stall_ms in PLAN[gpu]:
        start = T0 + round(at_s * SEC) - 8 * MS  # the stall's gap opens ~6 ms after its launch
        loop.off(t, start, syscall=FUTEX)
        t = loop.step(start, "clean", 0)
        t = loop.step(t, kind, round(stall_ms * MS))
        t = loop.step(t, "clean", 0)
    end = T0 + MINUTE_S * SEC
    loop.off(t, end, syscall=FUTEX)
    loop.aggregate(T0, end)
    return loop


def on_gpu(ev: Event, gpu: int) -> Event:
    """The loop's event as GPU `gpu`'s own: its process and threads renumbered, its gap on
    that GPU."""
    shift = 10 * gpu
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
    return dataclasses.replace(ev, **changes) if changes else ev  # type: ignore[type-var]


def samples(gpu: int, gaps: list[tuple[int, int]]) -> list[tuple[int, str, Event]]:
    """NVML's utilisation (200 ms) and power (100 ms) over the minute, lowered where the
    injected gaps fell (never to 0 %: the gaps are the feeding loop's, not NVML's)."""
    out: list[tuple[int, str, Event]] = []
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


def stream() -> list[dict[str, Any]]:
    """hello, snapshot and the minute's records, in the order a client receives them."""
    merged = FeedingLoop(plan=[], topology=TOPOLOGY)
    merged.emit(T0, "meta", ClockRef(ts_ns=T0, realtime_ns=1_772_452_800 * SEC))
    for probe in ("sched", "irq", "faults", "cstate", "malloc", "cuda", "nvml"):
        merged.emit(T0, "meta", ProbeStatus(ts_ns=T0, probe=probe, state="running"))
    for gpu in range(GPUS):
        loop = loop_for(gpu)
        for at, source, ev in loop.emitted:
            if source == "cpustats" and gpu:
                continue  # the CPUs are the node's, counted once
            merged.emit(at, source, on_gpu(ev, gpu))
        merged.emit(T0 + 5 * MS, "gpu", GpuProcesses(T0 + 5 * MS, gpu, (TGID + 10 * gpu,)))
        gaps = [(i.gap_start_ns, i.gap_end_ns) for i in loop.truth]
        merged.emitted += samples(gpu, gaps)
    gpus = [GpuInfo(k, "NVIDIA H200", f"GPU-{k:08d}", BUS[k], 0, (0, 1), True) for k in range(GPUS)]
    hello = {
        "type": "hello", "schema": STREAM_SCHEMA, "scope": "all", "version": "0.1.0",
        "host": "gpu-node-8x", "kernel": "6.18.44-gpu", "pid": 2301,
        "clock": {"ts_ns": T0, "realtime_ns": 1_772_452_800 * SEC},
        "topology": TOPOLOGY.to_record(),
        "probes": ["sched", "irq", "faults", "cstate", "malloc", "cuda", "nvml"],
    }  # fmt: skip
    out = StreamRecords()
    runtime = Runtime(ListSource(merged.delivered(seed=8), gpus=gpus), TOPOLOGY, sinks=[out],
                      analysis=lambda _: CONFIG, signals=False)  # fmt: skip
    runtime.run()
    state = runtime.state
    return [hello, state.snapshot(T0, state.status(T0)), *out.take()]


def write(path: Path) -> Path:
    path.write_bytes(ndjson(stream()))
    return path
