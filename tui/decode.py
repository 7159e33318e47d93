"""Stream records (docs/schema.md "Socket messages") decoded into what the views show.

Gaps and attributions become the engine's own records (daemon/analysis/records.py), type-checked as
every reader checks them (a record with a field of the wrong type is refused whole, and the
model counts it); their evidence reads through daemon/analysis/describe.py as in `report`, and
evidence of a kind this version does not know is kept as its fields (UnknownEvidence). CPU
statistics, probe health and GPU identity become the probes' own records too (CpuStats,
ProbeStatus, NVML's GpuInfo), decoded leniently, as is the daemon's status: unknown fields
are ignored, missing ones take defaults. What cannot be a measurement is refused as
malformed all the same (a value that is not finite, a negative count or duration, a gap
that ends before it starts), so that no view shows it as measured. Every string comes out
printable (no control character: tui.text says why), so no view can pass a process's name
to the terminal raw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, cast, get_args

import orjson

from gpujitter.daemon.analysis.records import Attribution, Evidence, GpuGap
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.probes.events import (
    TAG,
    BadRecord,
    CpuStats,
    ProbeState,
    ProbeStatus,
    from_record,
)
from gpujitter.probes.nvml import GpuInfo
from gpujitter.text import inert_record, printable

Record = Mapping[str, Any]

# A gap the engine has not attributed yet, where a cause would go (timeline, idle bars).
PENDING = ("attributing", "#e4e4e4")
# The probes' kernel time per second above which a figure cannot be a measurement: every CPU
# of a 4096-CPU node busy in BPF all the time.
MAX_BPF_NS_PER_S = 4096 * 1_000_000_000
# The evidence kinds this version reads ("what" of each member of the union).
KNOWN_EVIDENCE = frozenset(m.__dataclass_fields__[TAG].default for m in get_args(Evidence))


def _text(value: Any) -> str:
    """A string from the wire as the views may show it: names and reasons come from other
    processes, so every control character is escaped here (gpujitter.text.printable)."""
    return printable(str(value))


def finite(value: Any) -> float:
    """A measured value (a GPU sample): a number, or a string of one, that is finite. JSON
    has no nan or infinity, but float() reads them from a string, and no bar can show one."""
    number = float(value)
    if not math.isfinite(number):
        raise BadRecord(f"not a finite number: {printable(repr(value))}")
    return number


def count(value: Any, name: str) -> int:
    """A count or a duration from the wire: an int that is not negative (one that is was
    not measured, and would show as a figure that was)."""
    number = int(value)
    if number < 0:
        raise BadRecord(f"{name} is negative: {number}")
    return number


def gap(rec: Record) -> GpuGap:
    """A gpu.gap record, type-checked (BadRecord, a ValueError, when it is not one), its
    text made inert for the views."""
    ev = from_record(dict(rec))
    if not isinstance(ev, GpuGap):
        raise BadRecord(f"not a gpu.gap record: {rec.get('type')!r}")
    return inert_record(ev)


@dataclass(frozen=True, slots=True)
class UnknownEvidence:
    """An item of evidence of a kind this version does not know (a newer daemon's): kept,
    and shown as its fields, since the attribution it is part of is still right."""

    what: str
    fields: tuple[tuple[str, str], ...]

    def words(self, gap_start_ns: int) -> str:
        """As describe.evidence_line reads known kinds: the kind, then each field as sent."""
        return ", ".join([self.what, *(f"{name} {value}" for name, value in self.fields)])


def _unknown_evidence(item: Any) -> UnknownEvidence | None:
    """`item` as UnknownEvidence when it names a kind this version does not know; None for
    everything else (a known kind, or no evidence at all: from_record judges those)."""
    if not isinstance(item, dict):
        return None
    what = item.get(TAG)
    if not isinstance(what, str) or what in KNOWN_EVIDENCE:
        return None
    fields = tuple(
        (_text(name), _text(value if isinstance(value, str) else orjson.dumps(value).decode()))
        for name, value in item.items()
        if name != TAG
    )
    return UnknownEvidence(_text(what), fields)


def attribution(rec: Record) -> Attribution:
    """A gpu.attribution record as the engine's own type, type-checked, its text (names,
    evidence, remedies) made inert for the views; parts largest first. Evidence of a kind
    this version does not know is set aside before the check and put back as
    UnknownEvidence, so a newer daemon's attribution is shown, not refused."""
    rec = dict(rec)
    unknown: dict[int, tuple[UnknownEvidence, ...]] = {}
    if isinstance(rec.get("parts"), list | tuple):
        parts_in = []
        for n, part in enumerate(rec["parts"]):
            if isinstance(part, dict) and isinstance(part.get("evidence"), list | tuple):
                items = [(e, _unknown_evidence(e)) for e in part["evidence"]]
                if odd := tuple(u for _, u in items if u is not None):
                    unknown[n] = odd
                    part = {**part, "evidence": [e for e, u in items if u is None]}
            parts_in.append(part)
        rec["parts"] = parts_in
    ev = from_record(rec)
    if not isinstance(ev, Attribution):
        raise BadRecord(f"not a gpu.attribution record: {rec.get('type')!r}")
    # The breakdown reads an item of evidence only through its `words`, which
    # UnknownEvidence has as every known kind does.
    kept = tuple(
        replace(p, evidence=p.evidence + cast(tuple[Evidence, ...], unknown.get(n, ())))
        for n, p in enumerate(ev.parts)
    )
    parts = tuple(sorted(kept, key=lambda p: -p.ns))
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
        interval_ns=count(rec.get("interval_ns", 0), "interval_ns"),
        cpu=int(rec.get("cpu", 0)),
        hardirq_ns=count(rec.get("hardirq_ns", 0), "hardirq_ns"),
        softirq_ns=count(rec.get("softirq_ns", 0), "softirq_ns"),
        vector_ns=count(rec.get("vector_ns", 0), "vector_ns"),
        idle_ns=tuple(
            (_text(r[0]), count(r[1], "idle_ns"))
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
    """A meta.probe record; its state as sent (a newer daemon may know more states: the
    status line counts those as "other"). Counts are refused negative, and the BPF cost
    (-1: not measured) above MAX_BPF_NS_PER_S."""
    bpf = int(rec.get("bpf_ns_per_s", -1))
    if not -1 <= bpf <= MAX_BPF_NS_PER_S:
        raise BadRecord(f"bpf_ns_per_s out of range: {bpf}")
    return ProbeStatus(
        ts_ns=int(rec.get("ts_ns", 0)),
        probe=_text(rec.get("probe", "?")),
        state=cast(ProbeState, _text(rec.get("state", "off"))),
        reason=_text(rec.get("reason", "")),
        events=count(rec.get("events", 0), "events"),
        lost_kernel=count(rec.get("lost_kernel", 0), "lost_kernel"),
        lost_user=count(rec.get("lost_user", 0), "lost_user"),
        bpf_ns_per_s=bpf,
        cost_from=_text(rec.get("cost_from", "")),
    )


def daemon_status(rec: Record) -> DaemonStatus:
    """The daemon's own record type, read leniently, its strings made printable; a negative
    CPU share or count is refused (it was not measured)."""
    status = DaemonStatus.from_record(rec)
    if not status.cpu_percent >= 0:  # nan too
        raise BadRecord(f"cpu_percent is not a share: {status.cpu_percent}")
    for name in ("lost_kernel", "lost_user", "engine_dropped", "late_events", "attributed_early"):
        count(getattr(status, name), name)
    return status


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
