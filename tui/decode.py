"""Stream records (docs/schema.md "Socket messages") decoded into what the views show.

Gaps and attributions become the engine's own records (daemon/records.py), type-checked as
every reader checks them (a record with a field of the wrong type is refused whole, and the
model counts it); their evidence reads through daemon/describe.py as in `report`. CPU
statistics, probe health and the daemon's status are decoded leniently here: unknown fields
are ignored, missing ones take defaults. Every string comes out printable (no control
character: tui.text says why), so no view can pass a process's name to the terminal raw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpujitter.daemon.records import Attribution, GpuGap
from gpujitter.probes.events import BadRecord, from_record
from gpujitter.text import inert_record, printable

Record = Mapping[str, Any]

# A gap the engine has not attributed yet, where a cause would go (timeline, idle bars).
PENDING = ("attributing", "#e4e4e4")


def _text(value: Any) -> str:
    """A string from the wire as the views may show it: names and reasons come from other
    processes, so every control character is escaped here (gpujitter.text.printable)."""
    return printable(str(value))


def gap(rec: Record) -> GpuGap:
    """A gpu.gap record, type-checked (BadRecord, a ValueError, when it is not one), its
    text made inert for the views."""
    ev = from_record(dict(rec))
    if not isinstance(ev, GpuGap):
        raise BadRecord(f"not a gpu.gap record: {rec.get('type')!r}")
    return inert_record(ev)


def attribution(rec: Record) -> Attribution:
    """A gpu.attribution record as the engine's own type, type-checked, its text (names,
    evidence, remedies) made inert for the views; parts largest first."""
    ev = from_record(dict(rec))
    if not isinstance(ev, Attribution):
        raise BadRecord(f"not a gpu.attribution record: {rec.get('type')!r}")
    parts = tuple(sorted(ev.parts, key=lambda p: -p.ns))
    return inert_record(replace(ev, parts=parts))


# ---------------------------------------------------------------------------------------
# Node state: CPUs, probes, the daemon.


@dataclass(frozen=True, slots=True)
class CpuIrq:
    ts_ns: int
    interval_ns: int
    hardirq_ns: int
    softirq_ns: int
    top_irqs: tuple[tuple[str, int, int], ...]
    remote_irqs: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class CpuIdle:
    ts_ns: int
    interval_ns: int
    states: tuple[tuple[str, int], ...]  # (state, residency ns)


def _triples(value: Any) -> tuple[tuple[str, int, int], ...]:
    out = []
    for row in value or ():
        if isinstance(row, list | tuple) and len(row) >= 3:
            out.append((_text(row[0]), int(row[1]), int(row[2])))
    return tuple(out)


def cpu_stats(rec: Record) -> tuple[int, CpuIrq | None, CpuIdle | None]:
    """A cpu.stats record split into its interrupt part and its idle part: the irq probe and
    the cstate probe each send their own half for the same CPU and window."""
    cpu = int(rec.get("cpu", 0))
    ts, interval = int(rec.get("ts_ns", 0)), int(rec.get("interval_ns", 0))
    idle_rows = tuple(
        (_text(r[0]), int(r[1]))
        for r in rec.get("idle_ns") or ()
        if isinstance(r, list | tuple) and len(r) >= 2
    )
    hard = int(rec.get("hardirq_ns", 0)) + int(rec.get("vector_ns", 0))
    soft = int(rec.get("softirq_ns", 0))
    tops, remote = _triples(rec.get("top_irqs")), _triples(rec.get("remote_irqs"))
    irq = CpuIrq(ts, interval, hard, soft, tops, remote) if hard or soft or tops else None
    idle = CpuIdle(ts, interval, idle_rows) if idle_rows else None
    if irq is None and idle is None:
        irq = CpuIrq(ts, interval, 0, 0, (), ())  # a quiet window: no interrupts at all
    return cpu, irq, idle


@dataclass(frozen=True, slots=True)
class ProbeState:
    probe: str
    state: str
    reason: str = ""
    events: int = 0
    lost_kernel: int = 0
    lost_user: int = 0
    bpf_ns_per_s: int = -1  # -1: not measured


def probe_state(rec: Record) -> ProbeState:
    return ProbeState(
        probe=_text(rec.get("probe", "?")),
        state=_text(rec.get("state", "off")),
        reason=_text(rec.get("reason", "")),
        events=int(rec.get("events", 0)),
        lost_kernel=int(rec.get("lost_kernel", 0)),
        lost_user=int(rec.get("lost_user", 0)),
        bpf_ns_per_s=int(rec.get("bpf_ns_per_s", -1)),
    )


@dataclass(frozen=True, slots=True)
class WatchedThread:
    tid: int
    tgid: int
    comm: str
    cpu: int
    node: int


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    ts_ns: int
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    events_per_s: float = 0.0
    lost_kernel: int = 0
    lost_user: int = 0
    engine_dropped: int = 0
    client_dropped: int = 0
    threads: tuple[WatchedThread, ...] = ()
    self_inflicted: int = -1  # gaps the daemon's own threads caused; -1: not reported


def daemon_status(rec: Record) -> DaemonStatus:
    threads = tuple(
        WatchedThread(
            tid=int(t.get("tid", 0)),
            tgid=int(t.get("tgid", 0)),
            comm=_text(t.get("comm", "")),
            cpu=int(t.get("cpu", -1)),
            node=int(t.get("node", -1)),
        )
        for t in rec.get("threads") or ()
        if isinstance(t, Mapping)
    )
    return DaemonStatus(
        ts_ns=int(rec.get("ts_ns", 0)),
        cpu_percent=float(rec.get("cpu_percent", 0.0)),
        rss_bytes=int(rec.get("rss_bytes", 0)),
        events_per_s=float(rec.get("events_per_s", 0.0)),
        lost_kernel=int(rec.get("lost_kernel", 0)),
        lost_user=int(rec.get("lost_user", 0)),
        engine_dropped=int(rec.get("engine_dropped", 0)),
        client_dropped=int(rec.get("client_dropped", 0)),
        threads=threads,
        self_inflicted=int(rec.get("self_inflicted", -1)),
    )


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str = ""
    pci_bus_id: str = ""
    numa_node: int = -1


def gpu_info(rec: Record) -> GpuInfo:
    return GpuInfo(
        index=int(rec.get("index", 0)),
        name=_text(rec.get("name", "")),
        pci_bus_id=_text(rec.get("pci_bus_id", "")),
        numa_node=int(rec.get("numa_node", -1) if rec.get("numa_node") is not None else -1),
    )
