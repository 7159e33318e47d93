"""A recording as a timeline people scroll: Chrome trace-event JSON, which Perfetto's UI and
chrome://tracing open. A track per GPU (NVML utilisation and power as counters, each gap as
a slice whose children are its causes), a track per watched thread (off-CPU, run-queue
waits behind the task that ran instead, faults, IRQ time, allocator calls, CUDA calls),
written as it is read, so a recording of hours never has to fit in memory.

A cause's child slices are laid end to end inside their gap in the attribution's order:
their lengths are the time each cause took; where in the gap it fell is on the thread
tracks. `--merge` puts a PyTorch profiler (Kineto) trace of the same run on the same clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from gpujitter.daemon.analysis.describe import gpu_name, part_text
from gpujitter.daemon.analysis.engine.causes import cause_label
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, Pipeline
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import Clocks, format_wall, stepped, wall_ns
from gpujitter.probes.events import (
    AllocCall,
    AllocSyscall,
    ClockRef,
    CudaCall,
    Event,
    GcPause,
    GilWait,
    GpuSample,
    IrqStolen,
    MajorFault,
    MinorFaults,
    OffCpu,
)
from gpujitter.probes.topology import Topology

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

# GPU tracks live in a process of their own, numbered far above any real pid.
GPU_PID = 1 << 30


def _us(ns: int) -> float:
    return ns / 1000


@dataclass(slots=True)
class Clock:
    """Monotonic ns (the recording's) -> the output's ts in µs. Without a profiler trace
    that is the monotonic clock itself; with one, the profiler's own time base: the wall
    clock in force at each time (`wall`, given the recording's references as they are read:
    a clock set during the recording moves the times after it, as it moved the profiler's),
    less the profiler's base (`offset_ns`)."""

    offset_ns: int = 0
    wall: Clocks | None = None

    def ts(self, mono_ns: int) -> float:
        if self.wall is not None:
            return _us(self.wall.wall_ns(mono_ns) + self.offset_ns)
        return _us(mono_ns + self.offset_ns)


# How each kind of thread evidence becomes a slice: (start, end, name, args) of an event.
Slice = tuple[int, int, str, dict[str, Any]]


def _offcpu(ev: OffCpu) -> Iterator[Slice]:
    waited_from = ev.runnable_ns if 0 < ev.runnable_ns < ev.end_ns else ev.end_ns
    if waited_from > ev.ts_ns:
        yield ev.ts_ns, waited_from, f"off CPU ({ev.state})", {"cpu": ev.cpu, "syscall": ev.syscall}
    if waited_from < ev.end_ns:
        behind = f"{ev.other_comm} (tid {ev.other_tid})" if ev.other_tid else "another task"
        args = {"cpu_in": ev.cpu_in, "ran_instead": behind, "woken_by_tid": ev.waker_tid}
        if ev.other_ns:  # measured since schema 1.6
            args["ran_instead_ns"] = ev.other_ns
        yield waited_from, ev.end_ns, f"run-queue wait behind {behind}", args


_SLICES: dict[type, Callable[[Any], Iterable[Slice]]] = {
    OffCpu: _offcpu,
    MinorFaults: lambda ev: [(ev.ts_ns, ev.end_ns, f"{ev.count} minor faults",
                              {"fault_ns": ev.total_ns})],
    MajorFault: lambda ev: [(ev.ts_ns, ev.ts_ns + ev.dur_ns, f"major fault ({ev.kind})",
                             {"address": hex(ev.address)})],
    IrqStolen: lambda ev: [(ev.ts_ns, ev.end_ns, f"IRQ {ev.name} on CPU {ev.cpu}",
                            {"count": ev.count, "irq_ns": ev.total_ns, "remote": ev.remote})],
    AllocSyscall: lambda ev: [(ev.ts_ns, ev.ts_ns + ev.dur_ns, ev.syscall,
                               {"length": ev.length})],
    AllocCall: lambda ev: [(ev.ts_ns, ev.ts_ns + ev.dur_ns, "allocator call", {})],
    GcPause: lambda ev: [(ev.ts_ns, ev.ts_ns + ev.dur_ns, f"Python GC (generation {ev.generation})",
                          {"collected": ev.collected})],
    GilWait: lambda ev: [(ev.ts_ns, ev.ts_ns + ev.dur_ns, "GIL wait",
                          {"holder_tid": ev.holder_tid, "holder_comm": ev.holder_comm})],
    CudaCall: lambda ev: [(ev.ts_ns, ev.ts_ns + max(ev.dur_ns, 1_000), ev.func,
                           {"api": ev.api, "after_idle_ns": ev.after_idle_ns})],
}  # fmt: skip


@dataclass
class TimelineWriter:
    """Writes trace events to `out` as they come (call `event` for each of a recording's
    events, in order, then `close`)."""

    out: SupportsWrite[bytes]
    topology: Topology
    config: AnalysisConfig = field(default_factory=AnalysisConfig)
    clock: Clock = field(default_factory=Clock)
    gaps: int = 0
    slices: int = 0
    _first: bool = True
    _named: set[tuple[int, int]] = field(default_factory=set)
    _pipeline: Pipeline | None = None

    def __post_init__(self) -> None:
        self._pipeline = Pipeline(self.topology, self.config)
        self.out.write(b'{"displayTimeUnit":"ms","traceEvents":[\n')
        self._put({"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0,
                   "args": {"name": "GPUs (gpujitter)"}})  # fmt: skip

    def event(self, ev: Event) -> None:
        assert self._pipeline is not None
        if type(ev) is ClockRef and self.clock.wall is not None:
            self.clock.wall.add(ev)  # the wall clock was set: the times after it by the new one
        self._evidence(ev)
        for found in self._pipeline.feed(ev):
            self._finding(found)

    def close(self, extra: Iterable[dict[str, Any]] = ()) -> None:
        assert self._pipeline is not None
        for found in self._pipeline.flush():
            self._finding(found)
        for rec in extra:
            self._put(rec)
        self.out.write(b"\n]}\n")

    # -- writing --------------------------------------------------------------------

    def _put(self, rec: dict[str, Any]) -> None:
        self.out.write((b"" if self._first else b",\n") + orjson.dumps(rec))
        self._first = False

    def _name(self, pid: int, tid: int, name: str) -> None:
        if (pid, tid) not in self._named:
            self._named.add((pid, tid))
            self._put({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": name}})  # fmt: skip

    def _slice(self, pid: int, tid: int, start: int, end: int, name: str, **args: Any) -> None:
        self.slices += 1
        ts, dur = self.clock.ts(start), _us(max(end - start, 0))
        self._put({"ph": "X", "name": name, "cat": "gpujitter", "pid": pid, "tid": tid,
                   "ts": ts, "dur": dur, "args": args})  # fmt: skip

    # -- what goes where ------------------------------------------------------------

    def _evidence(self, ev: Event) -> None:
        if isinstance(ev, GpuSample):
            self._name(GPU_PID, ev.gpu, gpu_name(ev.gpu))
            unit, scale = ("%", 100) if ev.metric == "util" else ("W", 1)
            self._put({"ph": "C", "name": f"{gpu_name(ev.gpu)} {ev.metric} ({unit})",
                       "pid": GPU_PID, "tid": ev.gpu, "ts": self.clock.ts(ev.ts_ns),
                       "args": {ev.metric: ev.value * scale}})  # fmt: skip
            return
        slices = _SLICES.get(type(ev))
        if slices is None:
            return
        tid, tgid = ev.tid, ev.tgid  # type: ignore[attr-defined]
        comm = getattr(ev, "comm", "") or f"tid {tid}"
        self._name(tgid, tid, comm)
        for start, end, name, args in slices(ev):
            self._slice(tgid, tid, start, end, name, **args)

    def _finding(self, found: Event) -> None:
        if not isinstance(found, Attribution):
            return  # a gap is drawn once, with its causes, when it is attributed
        gpu = found.gpu
        track = gpu if gpu >= 0 else 999  # a gap on no known GPU
        self._name(GPU_PID, track, gpu_name(gpu))
        self.gaps += 1
        self._slice(GPU_PID, track, found.ts_ns, found.end_ns,
                    f"idle {found.dur_ns / 1e6:.1f} ms", sources=list(found.sources),
                    resolution_us=found.resolution_ns / 1000, confidence=found.confidence,
                    critical_thread=f"{found.comm} (pid {found.tgid} tid {found.tid})",
                    remedies=list(found.remedies))  # fmt: skip
        at = found.ts_ns
        for part in found.parts:
            label = cause_label(part.cause)
            self._slice(GPU_PID, track, at, at + part.ns, label, cause=part.cause,
                        ms=part.ns / 1e6, evidence=part_text(part, found))  # fmt: skip
            at += part.ns


def export(
    events: Iterable[Event],
    out: SupportsWrite[bytes],
    topology: Topology,
    config: AnalysisConfig,
    clock: Clock | None = None,
    extra: Iterable[dict[str, Any]] = (),
) -> TimelineWriter:
    """Write the timeline of `events` (a recording) to `out`; `extra`: trace events of
    another tool appended as they are (a profiler trace being merged)."""
    writer = TimelineWriter(out, topology, config, clock or Clock())
    for ev in events:
        writer.event(ev)
    writer.close(extra)
    return writer


def profiler_clock(profiler: dict[str, Any], wall: Clocks) -> Clock:
    """What puts the recording (CLOCK_MONOTONIC, `wall` pairing it with the wall clock of
    each time) on a Kineto trace's time base. Kineto writes ts in µs of the wall clock,
    either absolute or relative to `baseTimeNanoseconds`."""
    return Clock(offset_ns=-_base_ns(profiler), wall=wall)


def _base_ns(profiler: dict[str, Any]) -> int:
    base_ns = profiler.get("baseTimeNanoseconds", 0)
    if not isinstance(base_ns, int) or base_ns < 0:
        raise GpujitterError("profiler trace: baseTimeNanoseconds is not a time")
    return base_ns


def steps_in_profile(
    wall: Clocks, profiler: dict[str, Any], events: list[dict[str, Any]]
) -> list[str]:
    """Each setting of the wall clock that falls within the profiler trace's span, said: the
    recording's events on either side are each placed by the clock of their time, but the
    profiler's own times there need not follow it (PyTorch's profiler fits its clock to the
    wall clock between its start and its stop), so the two may not line up around it."""
    timed = [e["ts"] for e in events if type(e.get("ts")) in (int, float)]
    if not timed:
        return []
    base_ns = _base_ns(profiler)
    first_ns, last_ns = base_ns + round(min(timed) * 1000), base_ns + round(max(timed) * 1000)
    said = []
    for before, ref in wall.steps:
        was, now = wall_ns(before, ref.ts_ns), wall_ns(ref, ref.ts_ns)
        if min(was, now) <= last_ns and max(was, now) >= first_ns:
            said.append(
                f"merge: the wall clock was set {stepped(before, ref) / 1e9:+.3f} s at "
                f"{format_wall(before, ref.ts_ns, date=True)}, within the profiler trace's "
                "span: its own times there need not follow it (PyTorch's profiler fits its "
                "clock to the wall clock between its start and its stop), so its events and "
                "the recording's may not line up around it"
            )
    return said


def profiler_events(profiler: Any) -> list[dict[str, Any]]:
    """A Kineto (PyTorch profiler) trace's events, checked enough to be merged."""
    events = profiler.get("traceEvents") if isinstance(profiler, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise GpujitterError("profiler trace: no traceEvents list (not a Chrome trace?)")
    for n, event in enumerate(events):
        try:  # orjson reads 1024 levels of nesting but writes 254: said now, not at the end
            orjson.dumps(event)
        except orjson.JSONEncodeError as err:
            raise GpujitterError(f"profiler trace: event {n} cannot be merged: {err}") from None
    return events
