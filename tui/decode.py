"""Stream records (docs/schema.md "Socket messages") decoded into what the views show.

The one place that knows the wire shape of gaps, attributions (parts with cause, ns and
evidence; the critical thread; remedies), CPU statistics, probe health and the daemon's
status. Decoding is lenient, as the stream's compatibility rules ask: unknown fields are
ignored, missing ones take defaults, and an unknown evidence kind is shown as its fields.
Every string comes out printable (no control character: tui.text says why), so no view
can pass a process's name to the terminal raw.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpujitter.text import printable
from gpujitter.units import format_bytes, format_ns

Record = Mapping[str, Any]

# Attribution causes as the engine names them (daemon/records.py CAUSES), as people read
# them, with the colour each gets in bars and legends.
CAUSES: dict[str, tuple[str, str]] = {
    "swap_in": ("swap-in", "#d75f5f"),
    "major_fault": ("major fault", "#d7875f"),
    "irq": ("IRQ", "#d7af00"),
    "minor_faults": ("minor faults", "#afaf5f"),
    "idle_wake": ("idle wake-up", "#5fafd7"),
    "runq_wait": ("run-queue wait", "#af5fd7"),
    "alloc_stall": ("allocator stall", "#d75faf"),
    "io_wait": ("I/O wait", "#00afaf"),
    "blocked": ("blocked", "#5f87af"),
    "gc_pause": ("Python GC pause", "#d7af00"),
    "remote_oncpu": ("remote-node on-CPU", "#ff5f00"),
    "host_work": ("host work", "#5faf5f"),
    "unexplained": ("unexplained", "#808080"),
}


# A gap the engine has not attributed yet, where a cause would go (timeline, idle bars).
PENDING = ("attributing", "#e4e4e4")


def cause_order(cause: str) -> int:
    """Where a cause sorts: the table's order (worst-hurting first), unknown ones after."""
    return list(CAUSES).index(cause) if cause in CAUSES else len(CAUSES)


def cause_label(cause: str) -> str:
    return CAUSES.get(cause, (cause.replace("_", " "), ""))[0]


def cause_colour(cause: str) -> str:
    return CAUSES.get(cause, ("", "#87afaf"))[1]


def _text(value: Any) -> str:
    """A string from the wire as the views may show it: names and reasons come from other
    processes, so every control character is escaped here (gpujitter.text.printable)."""
    return printable(str(value))


def _label(value: Any) -> str:
    """A workload label (pod, container, Slurm job); anything but a string reads as none."""
    return _text(value) if isinstance(value, str) else ""


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, list | tuple) else ()


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(_text(v) for v in value) if isinstance(value, list | tuple) else ()


@dataclass(frozen=True, slots=True)
class Gap:
    gpu: int
    ts_ns: int
    end_ns: int
    sources: tuple[str, ...] = ()
    resolution_ns: int = 0
    confidence: float = 0.0
    tgids: tuple[int, ...] = ()

    @property
    def gap_id(self) -> str:
        return f"{self.gpu}:{self.ts_ns}"

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.ts_ns


def gap(rec: Record) -> Gap:
    """A gpu.gap record, or the gap an attribution describes (it repeats the gap's fields)."""
    return Gap(
        gpu=int(rec.get("gpu", 0)),
        ts_ns=int(rec.get("ts_ns", 0)),
        end_ns=int(rec.get("end_ns", rec.get("ts_ns", 0))),
        sources=_strs(rec.get("sources")),
        resolution_ns=int(rec.get("resolution_ns", 0)),
        confidence=float(rec.get("confidence", 0.0)),
        tgids=_ints(rec.get("tgids")),
    )


@dataclass(frozen=True, slots=True)
class Part:
    cause: str
    ns: int
    tids: tuple[int, ...]
    evidence: tuple[str, ...]  # one line each, untrusted text (shown through tui.text.plain)


@dataclass(frozen=True, slots=True)
class Thread:
    tid: int
    tgid: int
    comm: str
    role: str
    ns: int
    top_cause: str = ""
    hops: int = 0  # a waker's distance from the critical thread
    woke: int = 0  # the thread whose wait a waker ended
    causes: tuple[tuple[str, int], ...] = ()  # its own time per cause, largest first
    workload: str = ""  # its process's pod, container or Slurm job


def _cause_times(value: Any) -> tuple[tuple[str, int], ...]:
    """A thread's (cause, ns) list; entries that are not a cause and an integer are left out."""
    if not isinstance(value, list | tuple):
        return ()
    return tuple(
        (_text(c["cause"]), c["ns"])
        for c in value
        if isinstance(c, Mapping) and type(c.get("ns")) is int and "cause" in c
    )


@dataclass(frozen=True, slots=True)
class Attribution:
    gap: Gap
    parts: tuple[Part, ...]  # largest first
    tid: int = 0
    tgid: int = 0
    comm: str = ""
    gpu_node: int = -1
    threads: tuple[Thread, ...] = ()
    remedies: tuple[str, ...] = ()
    probes_off: tuple[str, ...] = ()
    workload: str = ""  # the critical thread's pod, container or Slurm job

    @property
    def top(self) -> Part | None:
        return self.parts[0] if self.parts else None

    def share(self, part: Part) -> float:
        return part.ns / self.gap.dur_ns if self.gap.dur_ns > 0 else 0.0


def attribution(rec: Record) -> Attribution:
    g = gap(rec)
    parts = [
        Part(
            cause=_text(p.get("cause", "unexplained")),
            ns=int(p.get("ns", 0)),
            tids=_ints(p.get("tids")),
            evidence=tuple(describe_evidence(e, g.ts_ns) for e in p.get("evidence") or ()),
        )
        for p in rec.get("parts") or ()
        if isinstance(p, Mapping)
    ]
    parts.sort(key=lambda p: p.ns, reverse=True)
    threads = tuple(
        Thread(
            tid=int(t.get("tid", 0)),
            tgid=int(t.get("tgid", 0)),
            comm=_text(t.get("comm", "")),
            role=_text(t.get("role", "")),
            ns=int(t.get("ns", 0)),
            top_cause=_text(t.get("top_cause", "")),
            hops=int(t.get("hops", 0)),
            woke=int(t.get("woke", 0)),
            causes=_cause_times(t.get("causes")),
            workload=_label(t.get("workload")),
        )
        for t in rec.get("threads") or ()
        if isinstance(t, Mapping)
    )
    return Attribution(
        gap=g,
        parts=tuple(parts),
        tid=int(rec.get("tid", 0)),
        tgid=int(rec.get("tgid", 0)),
        comm=_text(rec.get("comm", "")),
        gpu_node=int(rec.get("gpu_node", -1)),
        threads=threads,
        remedies=_strs(rec.get("remedies")),
        probes_off=_strs(rec.get("probes_off")),
        workload=_label(rec.get("workload")),
    )


# ---------------------------------------------------------------------------------------
# Evidence: one line per item, by its "what".


def _cpus(value: Any) -> str:
    cpus = _ints(value)
    if not cpus:
        return ""
    return f" on CPU {','.join(map(str, cpus))}" if len(cpus) > 1 else f" on CPU {cpus[0]}"


def _times(e: Record) -> str:
    count = int(e.get("count", 0))
    return f"{count}× {format_ns(int(e.get('ns', 0)))}" if count else format_ns(e.get("ns", 0))


def _irq(e: Record, _start: int) -> str:
    kind = e.get("irq_kind", "irq")
    number = f" {e['irq']}" if kind == "hardirq" and "irq" in e else ""
    text = f"{kind}{number} {e.get('name', '')}{_cpus(e.get('cpus'))}: {_times(e)}"
    notes = []
    if int(e.get("device_node", -1)) >= 0:
        notes.append(f"device on node {e['device_node']}")
    if e.get("remote_to_gpu"):
        notes.append("remote to the GPU")
    if e.get("handled_remote"):
        notes.append("handled off its device's node")
    return text + (f" ({', '.join(notes)})" if notes else "")


def _task(e: Record, _start: int) -> str:
    tid = int(e.get("tid", 0))
    who = f"{e.get('comm', '')} (tid {tid})" if tid else "an idle CPU or an unknown task"
    text = f"waited behind {who}{_cpus(e.get('cpus'))}: {_times(e)}"
    return text + (", after a cross-NUMA migration" if e.get("after_migration") else "")


def _migration(e: Record, start: int) -> str:
    at = int(e.get("at_ns", start)) - start
    return (
        f"tid {e.get('tid', 0)} migrated CPU {e.get('src_cpu')} → {e.get('dst_cpu')} "
        f"(node {e.get('src_node')} → {e.get('dst_node')}) at +{format_ns(at)}"
    )


def _idle(e: Record, _start: int) -> str:
    latency = int(e.get("exit_latency_ns", -1))
    exit_text = f" (exit latency {format_ns(latency)})" if latency >= 0 else ""
    return f"woken from {e.get('state_name', '?')}{_cpus(e.get('cpus'))}: {_times(e)}{exit_text}"


def _syscall(e: Record, _start: int) -> str:
    call = e.get("syscall") or (f"syscall {e['nr']}" if int(e.get("nr", -1)) >= 0 else "")
    where = f" in {call}" if call else ""
    return f"{e.get('state', 'off-CPU')}{where}: {_times(e)}"


def _io(e: Record, _start: int) -> str:
    disk = e.get("name") or e.get("dev", "?")
    call = f" in {e['syscall']}" if e.get("syscall") else ""
    size = int(e.get("bytes", 0))
    text = f"{e.get('op') or 'I/O'} on {disk}{call}: {_times(e)}"
    text += f", {format_bytes(size)}" if size else ""
    notes = []
    if int(e.get("node", -1)) >= 0:
        notes.append(f"device on node {e['node']}")
    if e.get("remote_to_gpu"):
        notes.append("remote to the GPU")
    return text + (f" ({', '.join(notes)})" if notes else "")


def _fault(e: Record, _start: int) -> str:
    addresses = _ints(e.get("addresses"))
    first = f", first at {addresses[0]:#x}" if addresses else ""
    count = int(e.get("count", 0))
    return (
        f"{e.get('kind', '?')} faults{_cpus(e.get('cpus'))}: {count}× "
        f"{format_ns(int(e.get('ns', 0)))}{first}"
    )


def _alloc(e: Record, _start: int) -> str:
    who = f" ({e['allocator']})" if e.get("allocator") else ""
    size = int(e.get("bytes", 0))
    return f"{e.get('call', '?')}{who}: {_times(e)}" + (f", {format_bytes(size)}" if size else "")


def _gc(e: Record, _start: int) -> str:
    gen = int(e.get("generation", -1))
    which = f"generation {gen}" if gen >= 0 else "generation unknown"
    freed = int(e.get("collected", -1))
    whole = f", {format_ns(int(e.get('dur_ns', 0)))} in all"
    return f"GC {which}: {_times(e)}{whole}" + (f", {freed} objects freed" if freed >= 0 else "")


def _node(e: Record, _start: int) -> str:
    where = "remote" if e.get("remote") else "local"
    cpus = _cpus(e.get("cpus"))
    return f"on-CPU on node {e.get('node')} ({where}){cpus}: {format_ns(e.get('ns', 0))}"


def _reason(e: Record, _start: int) -> str:
    reasons = {
        "no_thread": "no feeding thread known",
        "no_data": "no probe data for the span",
        "short_offcpu": "off-CPU spans below the probe's threshold",
        "evicted": "data evicted before the gap was attributed",
    }
    reason = str(e.get("reason", ""))
    return f"{reasons.get(reason, reason)}: {format_ns(e.get('ns', 0))}"


_DESCRIBE: dict[str, Callable[[Record, int], str]] = {
    "irq": _irq,
    "task": _task,
    "migration": _migration,
    "idle": _idle,
    "syscall": _syscall,
    "io": _io,
    "fault": _fault,
    "alloc": _alloc,
    "gc": _gc,
    "node": _node,
    "reason": _reason,
}


def describe_evidence(e: Any, gap_start_ns: int) -> str:
    """One line of evidence, shown inert: its names (tasks, IRQs) are other processes'."""
    if not isinstance(e, Mapping):
        return _text(e)
    describe = _DESCRIBE.get(str(e.get("what", "")))
    if describe is not None:
        try:
            return _text(describe(e, gap_start_ns))
        except (TypeError, ValueError):
            pass  # a field of an unexpected type: fall back to the raw fields
    return _text(" ".join(f"{k}={v}" for k, v in e.items()))


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
