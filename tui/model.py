"""What the app knows about the node, built only from stream records: the same whether they
come from the daemon's socket, the in-process probes or a recorded trace.

`apply(record)` folds one record in; the views read the result. Time is the data's own: `now_ns`
is the latest monotonic timestamp seen (the replay clock in replay), never the machine's
clock, so a screen depends only on the records that built it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.service.status import DaemonStatus, WatchedThread
from gpujitter.probes.clock import STEP_NS
from gpujitter.probes.events import CpuStats, ProbeStatus
from gpujitter.probes.nvml import GpuInfo
from gpujitter.text import printable
from gpujitter.tui import decode
from gpujitter.tui.text import WallClock

Record = Mapping[str, Any]
Handler = Callable[["NodeModel", Record], None]
_HANDLERS: dict[str, Handler] = {}

GAP_LIMIT = 2000  # gaps kept (newest); the daemon's log keeps them all
SAMPLES_KEPT_NS = 600 * 1_000_000_000  # GPU samples kept: the widest timeline window
STALE_INTERVALS = 3  # a CPU's interrupt figures count as zero after this many quiet windows
# Distinct keys kept in `ignored` (record types, error messages: free text from the sender);
# the rest are counted under "other", so a stream of ever new ones cannot grow the model.
IGNORED_KEYS = 32


def handles(*kinds: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for kind in kinds:
            _HANDLERS[kind] = fn
        return fn

    return register


@dataclass(slots=True)
class Hello:
    host: str = ""
    kernel: str = ""
    version: str = ""
    pid: int = 0
    scope: str = ""
    cpu_node: dict[int, int] = field(default_factory=dict)
    gpu_node: dict[str, int] = field(default_factory=dict)
    override: str | None = None


@dataclass(slots=True)
class CpuState:
    cpu: int
    irq: CpuStats | None = None  # the latest window of the irq probe
    idle: CpuStats | None = None  # the latest window of the cstate probe


@dataclass(frozen=True, slots=True)
class CpuRow:
    """One CPU as the CPUs view shows it: shares of its time over its latest windows."""

    cpu: int
    node: int
    hardirq: float  # fraction of the window
    softirq: float
    idle: tuple[tuple[str, float], ...]  # (state, fraction), largest first
    top_irqs: tuple[tuple[str, int, int], ...]
    remote_irqs: tuple[tuple[str, int, int], ...]
    threads: tuple[tuple[WatchedThread, bool], ...]  # (thread, placed remote from its GPU)


class NodeModel:
    def __init__(self, clock: WallClock | None = None) -> None:
        self.clock = clock or WallClock()
        self._tz = self.clock.tz
        self.reset()

    def reset(self) -> None:
        """Forget everything (a replay seeking backwards starts over)."""
        self.clock = WallClock(tz=self._tz)
        self.hello = Hello()
        self.now_ns = 0
        self.gpus: dict[int, GpuInfo] = {}
        self.samples: dict[tuple[int, str], deque[tuple[int, float, int]]] = {}
        self.procs: dict[int, tuple[int, ...]] = {}
        self.gaps: dict[str, GpuGap] = {}
        self.attributions: dict[str, Attribution] = {}
        self.cpus: dict[int, CpuState] = {}
        self.probes: dict[str, ProbeStatus] = {}
        self.status: DaemonStatus | None = None
        self.names: dict[int, str] = {}  # tgid or tid -> command name, from any record
        self.daemon_dropped = 0  # records the daemon dropped for this client
        # Records not shown, by why: a type this version does not know, "TYPE (malformed)",
        # "error: MESSAGE" (the daemon's error lines); at most IGNORED_KEYS keys.
        self.ignored: Counter[str] = Counter()
        self.damage: list[str] = []  # a replayed recording's damage notes (what it lacks)
        # Each setting of the wall clock a meta.clock said (when, by the monotonic clock, and
        # by how much): every time shown moved with it, which the status line says.
        self.clock_set: list[tuple[int, int]] = []
        self.changed: set[str] = {"gpus", "gaps", "cpus", "status"}

    # -- folding records in ---------------------------------------------------------

    def apply(self, rec: Record) -> None:
        kind = rec.get("type")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self.ignore(printable(str(kind)))
            return
        try:
            handler(self, rec)
        except (TypeError, ValueError, KeyError, AttributeError):
            self.ignore(printable(f"{kind} (malformed)"))

    def ignore(self, why: str) -> None:
        """Count a record not shown under `why`, or under "other" once IGNORED_KEYS - 1
        other keys are there."""
        if why not in self.ignored and len(self.ignored) >= IGNORED_KEYS - 1:
            why = "other"
        self.ignored[why] += 1
        self.changed.add("status")

    def apply_all(self, records: Iterable[Record]) -> None:
        for rec in records:
            self.apply(rec)

    def _saw(self, ts_ns: int) -> None:
        self.now_ns = max(self.now_ns, ts_ns)

    def take_changes(self) -> set[str]:
        """Which parts changed since the last call ("gpus", "gaps", "cpus", "status")."""
        changed, self.changed = self.changed, set()
        return changed

    # -- what the views read --------------------------------------------------------

    def gaps_newest_first(self) -> list[tuple[GpuGap, Attribution | None]]:
        ordered = sorted(self.gaps.values(), key=lambda g: (g.ts_ns, g.gpu), reverse=True)
        return [(g, self.attributions.get(g.gap_id)) for g in ordered]

    def gpu_indexes(self) -> list[int]:
        seen = set(self.gpus) | {g for g, _ in self.samples} | set(self.procs)
        seen |= {g.gpu for g in self.gaps.values()}
        return sorted(seen)

    def gpu_node(self, gpu: int) -> int:
        info = self.gpus.get(gpu)
        if info is None:
            return -1
        if info.numa_node is not None:
            return info.numa_node
        return self.hello.gpu_node.get(info.pci_bus_id, -1)

    def gpu_of_process(self, tgid: int) -> int | None:
        for gpu, pids in self.procs.items():
            if tgid in pids:
                return gpu
        return None

    def series(self, gpu: int, metric: str) -> deque[tuple[int, float, int]]:
        return self.samples.get((gpu, metric), deque())

    def gaps_of(self, gpu: int, since_ns: int) -> list[GpuGap]:
        return [g for g in self.gaps.values() if g.gpu == gpu and g.end_ns >= since_ns]

    def top_cause(self, gap: GpuGap) -> str | None:
        """The gap's top cause; None while it waits for its attribution."""
        a = self.attributions.get(gap.gap_id)
        return a.top.cause if a is not None and a.top is not None else None

    def idle_by_cause(self, gpu: int, since_ns: int) -> list[tuple[str | None, int]]:
        """Where the GPU's idle time since `since_ns` went: ns per cause over its gaps (None:
        gaps not attributed yet), largest first."""
        spent: Counter[str | None] = Counter()
        for gap in self.gaps_of(gpu, since_ns):
            a = self.attributions.get(gap.gap_id)
            if a is None or not a.parts:
                spent[None] += gap.dur_ns
                continue
            for part in a.parts:
                spent[part.cause] += part.ns
        return sorted(spent.items(), key=lambda kv: (-kv[1], str(kv[0])))

    def name_of(self, pid: int) -> str:
        return self.names.get(pid, "")

    def cpu_node(self, cpu: int) -> int:
        return self.hello.cpu_node.get(cpu, -1)

    def cpu_rows(self) -> list[CpuRow]:
        cpus = sorted(set(self.cpus) | set(self.hello.cpu_node))
        by_cpu: dict[int, list[tuple[WatchedThread, bool]]] = {}
        for t in self.status.threads if self.status else ():
            by_cpu.setdefault(t.cpu, []).append((t, self.placed_remote(t)))
        rows = []
        for cpu in cpus:
            state = self.cpus.get(cpu) or CpuState(cpu)
            irq = state.irq
            if irq is not None and irq.interval_ns > 0:
                stale = irq.ts_ns + irq.interval_ns * STALE_INTERVALS < self.now_ns
                irq = None if stale else irq
            hard = soft = 0.0
            if irq is not None and irq.interval_ns > 0:
                hard = (irq.hardirq_ns + irq.vector_ns) / irq.interval_ns
                soft = irq.softirq_ns / irq.interval_ns
            idle: tuple[tuple[str, float], ...] = ()
            if state.idle is not None and state.idle.interval_ns > 0:
                share = [(name, ns / state.idle.interval_ns) for name, ns in state.idle.idle_ns]
                idle = tuple(sorted(share, key=lambda s: s[1], reverse=True))
            rows.append(
                CpuRow(
                    cpu=cpu,
                    node=self.cpu_node(cpu),
                    hardirq=hard,
                    softirq=soft,
                    idle=idle,
                    top_irqs=irq.top_irqs if irq else (),
                    remote_irqs=irq.remote_irqs if irq else (),
                    threads=tuple(by_cpu.get(cpu, ())),
                )
            )
        return rows

    def placed_remote(self, thread: WatchedThread) -> bool:
        """The thread runs on a NUMA node other than its GPU's (both known)."""
        gpu = self.gpu_of_process(thread.tgid)
        if gpu is None:
            return False
        node = thread.node if thread.node >= 0 else self.cpu_node(thread.cpu)
        gpu_node = self.gpu_node(gpu)
        return node >= 0 and gpu_node >= 0 and node != gpu_node

    def lost_events(self) -> int:
        """Events the probes lost (kernel ring buffers, Python queues) plus the engine's. The
        daemon's status counts the engine's drops in its lost_user already; the probes' own
        records, when newer than the status, lack them."""
        lost = sum(p.lost_kernel + p.lost_user for p in self.probes.values())
        if self.status is not None:
            said = self.status.lost_kernel + self.status.lost_user
            lost = max(lost + self.status.engine_dropped, said)
        return lost


# ---------------------------------------------------------------------------------------
# Handlers, one per record type the views use.


@handles("hello")
def _hello(m: NodeModel, rec: Record) -> None:
    clock = rec.get("clock") or {}
    if clock.get("realtime_ns"):
        m.clock = WallClock(int(clock["ts_ns"]), int(clock["realtime_ns"]), m._tz)
    topo = rec.get("topology") or {}
    m.hello = Hello(
        host=printable(str(rec.get("host", ""))),
        kernel=printable(str(rec.get("kernel", ""))),
        version=printable(str(rec.get("version", ""))),
        pid=int(rec.get("pid", 0)),
        scope=printable(str(rec.get("scope", ""))),
        cpu_node={int(c): int(n) for c, n in (topo.get("cpu_node") or {}).items()},
        gpu_node={str(b): int(n) for b, n in (topo.get("gpu_node") or {}).items()},
        override=printable(str(topo["override"])) if topo.get("override") else None,
    )
    m.changed |= {"gpus", "cpus", "status"}


@handles("snapshot")
def _snapshot(m: NodeModel, rec: Record) -> None:
    for g in rec.get("gpus") or ():
        info = decode.gpu_info(g)
        m.gpus[info.index] = info
    for key in ("probes", "gaps", "attributions", "cpus"):
        for item in rec.get(key) or ():
            m.apply(item)
    if rec.get("status"):
        m.apply(rec["status"])
    if rec.get("clock"):  # the wall clock was set since the hello's reference
        m.apply(rec["clock"])
    m._saw(int(rec.get("ts_ns", 0)))
    m.changed |= {"gpus", "gaps", "cpus", "status"}


@handles("gpu.gap")
def _gap(m: NodeModel, rec: Record) -> None:
    g = decode.gap(rec)
    m.gaps[g.gap_id] = g
    _trim_gaps(m)
    m._saw(g.end_ns)
    m.changed |= {"gaps", "gpus"}


@handles("gpu.attribution")
def _attribution(m: NodeModel, rec: Record) -> None:
    a = decode.attribution(rec)
    m.gaps.setdefault(a.gap.gap_id, a.gap)
    m.attributions[a.gap.gap_id] = a
    if a.tgid and a.comm:
        m.names[a.tgid] = a.comm
    for t in a.threads:
        if t.comm:
            m.names.setdefault(t.tgid, t.comm)
    _trim_gaps(m)
    m._saw(a.gap.end_ns)
    m.changed |= {"gaps", "gpus"}


def _trim_gaps(m: NodeModel) -> None:
    if len(m.gaps) <= GAP_LIMIT:
        return
    oldest = sorted(m.gaps.values(), key=lambda g: g.ts_ns)[: len(m.gaps) - GAP_LIMIT]
    for g in oldest:
        del m.gaps[g.gap_id]
        m.attributions.pop(g.gap_id, None)


@handles("gpu.sample")
def _sample(m: NodeModel, rec: Record) -> None:
    gpu, metric = int(rec["gpu"]), str(rec["metric"])
    ts = int(rec["ts_ns"])
    value = decode.finite(rec["value"])
    period_ns = decode.count(rec.get("period_ns", 0), "period_ns")
    series = m.samples.setdefault((gpu, metric), deque())  # (a refused sample adds no GPU)
    series.append((ts, value, period_ns))
    while series and series[0][0] < ts - SAMPLES_KEPT_NS:
        series.popleft()
    m._saw(ts)
    m.changed.add("gpus")


@handles("gpu.procs")
def _procs(m: NodeModel, rec: Record) -> None:
    m.procs[int(rec["gpu"])] = tuple(int(p) for p in rec.get("pids") or ())
    m._saw(int(rec.get("ts_ns", 0)))
    m.changed |= {"gpus", "cpus"}


@handles("cpu.stats")
def _cpu(m: NodeModel, rec: Record) -> None:
    stats = decode.cpu_stats(rec)
    state = m.cpus.setdefault(stats.cpu, CpuState(stats.cpu))
    if decode.has_irq(stats):
        state.irq = stats
    if stats.idle_ns:
        state.idle = stats
    m._saw(stats.ts_ns + stats.interval_ns)
    m.changed.add("cpus")


@handles("meta.probe")
def _probe(m: NodeModel, rec: Record) -> None:
    p = decode.probe_status(rec)
    m.probes[p.probe] = p
    m._saw(int(rec.get("ts_ns", 0)))
    m.changed.add("status")


@handles("daemon.status")
def _status(m: NodeModel, rec: Record) -> None:
    m.status = decode.daemon_status(rec)
    for t in m.status.threads:
        if t.comm:
            m.names.setdefault(t.tgid, t.comm)
    m._saw(m.status.ts_ns)
    m.changed |= {"status", "cpus"}


@handles("meta.exec")
def _exec(m: NodeModel, rec: Record) -> None:
    m.names[int(rec["tgid"])] = printable(str(rec.get("comm", "")))


@handles("meta.clock")
def _clock(m: NodeModel, rec: Record) -> None:
    was, m.clock = m.clock, WallClock(int(rec["ts_ns"]), int(rec["realtime_ns"]), m._tz)
    moved = m.clock.wall_ns(0) - was.wall_ns(0)  # (a repeat of the reference moves nothing)
    if was.known and abs(moved) > STEP_NS:
        m.clock_set.append((m.clock.ts_ns, moved))
    m.changed |= {"gaps", "status"}


@handles("dropped")
def _dropped(m: NodeModel, rec: Record) -> None:
    n = decode.count(rec.get("count", 0), "count")
    total = decode.count(rec.get("total", 0), "total")
    m.daemon_dropped = max(m.daemon_dropped + n, total)
    m.changed.add("status")


@handles("meta.watch", "meta.exit", "pong")
def _ignored_quietly(m: NodeModel, rec: Record) -> None:
    """Known and not shown (yet): not counted as unknown."""


@handles("replay.damage")
def _damage(m: NodeModel, rec: Record) -> None:
    note = printable(str(rec["message"]))
    if note not in m.damage:
        m.damage.append(note)
        m.changed.add("status")


@handles("error")
def _error(m: NodeModel, rec: Record) -> None:
    m.ignore(printable(f"error: {rec.get('message', '')}"))
