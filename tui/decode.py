"""Stream records (docs/schema.md "Socket messages") decoded into what the views show.

Gaps and attributions become the engine's own records (daemon/analysis/records.py), type-checked as
every reader checks them (a record with a field of the wrong type is refused whole, and the
model counts it); their evidence reads through daemon/analysis/describe.py as in `report`. CPU
statistics, probe health and GPU identity become the probes' own records too (CpuStats,
ProbeStatus, NVML's GpuInfo), decoded leniently, as is the daemon's status: unknown fields
are ignored, missing ones take defaults. Every string comes out printable (no control
character: tui.text says why), so no view can pass a process's name to the terminal raw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.probes.events import BadRecord, CpuStats, ProbeState, ProbeStatus, from_record
from gpujitter.probes.nvml import GpuInfo
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


def _triples(value: Any) -> tuple[tuple[str, int, int], ...]:
    out = []
    for row in value or ():
        if isinstance(row, list | tuple) and len(row) >= 3:
            out.append((_text(row[0]), int(row[1]), int(row[2])))
    return tuple(out)


def cpu_stats(rec: Record) -> CpuStats:
    """A cpu.stats record as the probes' own type. The irq probe and the cstate probe each
    send their own half for the same CPU and window: `has_irq`/`has_idle` tell them apart."""
    return CpuStats(
        ts_ns=int(rec.get("ts_ns", 0)),
        interval_ns=int(rec.get("interval_ns", 0)),
        cpu=int(rec.get("cpu", 0)),
        hardirq_ns=int(rec.get("hardirq_ns", 0)),
        softirq_ns=int(rec.get("softirq_ns", 0)),
        vector_ns=int(rec.get("vector_ns", 0)),
        idle_ns=tuple(
            (_text(r[0]), int(r[1]))
            for r in rec.get("idle_ns") or ()
            if isinstance(r, list | tuple) and len(r) >= 2
        ),
        top_irqs=_triples(rec.get("top_irqs")),
        remote_irqs=_triples(rec.get("remote_irqs")),
    )


def has_irq(stats: CpuStats) -> bool:
    """Whether the record carries the irq probe's half; a window with neither half is a quiet
    one of the irq probe (no interrupts at all)."""
    return bool(stats.hardirq_ns or stats.vector_ns or stats.softirq_ns or stats.top_irqs) or (
        not stats.idle_ns
    )


def probe_status(rec: Record) -> ProbeStatus:
    """A meta.probe record; its state as sent (a newer daemon may know more states)."""
    return ProbeStatus(
        ts_ns=int(rec.get("ts_ns", 0)),
        probe=_text(rec.get("probe", "?")),
        state=cast(ProbeState, _text(rec.get("state", "off"))),
        reason=_text(rec.get("reason", "")),
        events=int(rec.get("events", 0)),
        lost_kernel=int(rec.get("lost_kernel", 0)),
        lost_user=int(rec.get("lost_user", 0)),
        bpf_ns_per_s=int(rec.get("bpf_ns_per_s", -1)),
    )


def daemon_status(rec: Record) -> DaemonStatus:
    """The daemon's own record type, read leniently, its strings made printable."""
    return DaemonStatus.from_record(rec)


def gpu_info(rec: Record) -> GpuInfo:
    """A GPU of the snapshot record as NVML's own type; what the stream does not carry (the
    UUID, persistence mode) is unknown."""
    node = rec.get("numa_node")
    return GpuInfo(
        index=int(rec.get("index", 0)),
        name=_text(rec.get("name", "")),
        uuid="",
        pci_bus_id=_text(rec.get("pci_bus_id", "")),
        numa_node=int(node) if node is not None and int(node) >= 0 else None,
        local_cpus=tuple(int(c) for c in rec.get("local_cpus") or ()),
        persistence_mode=None,
    )
