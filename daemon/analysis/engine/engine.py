"""The attribution engine: probe events and GPU gaps in, one Attribution per gap out.

A pure function of its input sequence: no clocks, no randomness, no dependence on hash seeds or
on how the probes' deliveries interleave (within the lateness bound), so the daemon (live),
`gpujitter report` (a recorded trace) and the drills all run this same code and get the same
records. Time advances only through event timestamps: the watermark is the latest end time
seen; a gap is attributed once the watermark has passed its end by config.lateness_ns, so
that aggregates polled once a second have arrived. The daemon must capture exactly the
events it feeds, in the order it feeds them; replay then reproduces the live attributions.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

from gpujitter.daemon.analysis.engine.causes import CAUSE_BY_NAME, CAUSE_ORDER, CAUSES
from gpujitter.daemon.analysis.engine.divide import CLAIMING_KINDS, Divider, Tally
from gpujitter.daemon.analysis.engine.timeline import SPAN_RULES, SpanRule, Timeline, content
from gpujitter.daemon.analysis.gaps import UNKNOWN_GPU
from gpujitter.daemon.analysis.records import (
    Attribution,
    CauseTime,
    GpuGap,
    Part,
    TaskEvidence,
    ThreadRole,
)
from gpujitter.daemon.analysis.remedies import RemedyContext
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import (
    Event,
    GpuProcesses,
    OffCpuOpen,
    OwnThreads,
    ProbeStatus,
    WorkloadInfo,
    end_of,
)
from gpujitter.probes.topology import Topology
from gpujitter.probes.workload import label

_HISTORY = 16  # probe states and GPU process lists kept per probe / GPU
_DELIVERING = (None, "running", "degraded")  # probe states whose causes can be seen


@dataclass(frozen=True, slots=True)
class EngineConfig:
    lateness_ns: int = 2_000_000_000  # hold a gap this long past its end for late events
    retention_ns: int = 60_000_000_000  # keep timelines this far behind the watermark
    max_spans: int = 100_000  # timeline entries over all threads (memory bound)
    max_pending_gaps: int = 1_000  # beyond this, the oldest gap is attributed at once
    # Work that following one gap's waits into wakers' timelines (wakers of wakers too,
    # across processes) may do: segments swept, plus one per stretch read.
    waker_budget: int = 1_024
    migration_window_ns: int = 10_000_000  # a run-queue wait this soon after one is flagged
    gpu_bus_ids: Mapping[int, str] = field(default_factory=dict)  # GPU index -> PCI bus id
    syscall_abi: str = "x86_64"  # of the traced host: syscall numbers -> names
    max_threads_listed: int = 6
    max_addresses: int = 8  # fault addresses kept per part
    remedy_min_pct: int = 20  # remedies for the top cause, and others at least this share
    max_workloads: int = 4_096  # processes whose workload label is remembered
    evict_every_ns: int = 1_000_000_000

    def __post_init__(self) -> None:
        names = (
            "lateness_ns",
            "retention_ns",
            "migration_window_ns",
            "evict_every_ns",
            "waker_budget",
        )
        for name in names:
            if getattr(self, name) < 0:
                raise GpujitterError(f"engine: {name} must not be negative")
        for name in ("max_spans", "max_pending_gaps", "max_threads_listed", "max_workloads"):
            if getattr(self, name) < 1:
                raise GpujitterError(f"engine: {name} must be at least 1")
        if self.max_addresses < 0:
            raise GpujitterError("engine: max_addresses must not be negative")
        if not 0 <= self.remedy_min_pct <= 100:
            raise GpujitterError("engine: remedy_min_pct must be from 0 to 100")
        if self.retention_ns < self.lateness_ns:
            raise GpujitterError("engine: retention must be at least the lateness bound")


@dataclass(frozen=True, slots=True)
class EngineStats:
    events: int  # fed, gaps included
    gaps: int
    attributions: int
    late_events: int  # arrived more than the lateness bound after they ended
    forced: int  # gaps attributed early because too many were pending
    spans: int  # timeline entries held now
    threads: int
    pending: int
    evicted: int  # timeline entries dropped, by age or count
    follow_cut: int = 0  # gaps with a wait left unfollowed: the waker budget ran out


class Engine:
    def __init__(self, topology: Topology, config: EngineConfig | None = None) -> None:
        self.topology = topology
        self.config = config or EngineConfig()
        self._timelines: dict[int, Timeline] = {}
        # tid -> the watermark when a span of it last came, least lately first: whom eviction
        # by count lets go first.
        self._heard: OrderedDict[int, int] = OrderedDict()
        # tid -> the horizon of a timeline evicted whole by count (its thread may come back,
        # and a gap before the horizon is then "evicted", not "no data"); kept for the
        # retention.
        self._gone: dict[int, int] = {}
        self._by_tgid: dict[int, set[int]] = {}
        self._pending: list[tuple[tuple[Any, ...], GpuGap]] = []
        self._procs: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        self._probes: dict[str, list[tuple[int, str]]] = {}
        self._workloads: dict[int, str] = {}  # tgid -> label, oldest announcement first
        # gpujitter's own threads (meta.self): every thread announced by its process, those
        # that ended too (a gap may be attributed after the thread that delayed it ended).
        self._own: tuple[int, set[int]] = (0, set())
        self._now = 0
        self._last_evict = 0
        self._size = 0
        self._counts = dict.fromkeys(
            ("events", "gaps", "attributions", "late", "forced", "follow_cut"), 0
        )
        self._evicted = 0
        # Threads announced off CPU (OffCpuOpen) before any span of theirs came: tid -> since,
        # handed to the timeline when one is made. Not a timeline of their own: a thread with
        # nothing known is not a waker to follow or a thread to list.
        self._asleep: dict[int, int] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            GpuGap: self._on_gap,
            GpuProcesses: self._on_procs,
            ProbeStatus: self._on_status,
            WorkloadInfo: self._on_workload,
            OwnThreads: self._on_own,
            OffCpuOpen: self._on_open,
        }

    # -- input ---------------------------------------------------------------------------

    def feed(self, ev: Event) -> list[Attribution]:
        """Take one event; returns the attributions of the gaps it made ready (often none)."""
        self._counts["events"] += 1
        rule = SPAN_RULES.get(type(ev))
        if rule is not None:
            start, end = rule.bounds(ev)
            self._on_span(ev, rule, start, end)
        else:
            end = end_of(ev)
            handler = self._handlers.get(type(ev))
            if handler is not None:
                handler(ev)
        if end > self._now:
            self._now = end
        if self._now - self._last_evict >= self.config.evict_every_ns:
            self._evict_by_age()
        pending = self._pending
        if pending and (
            pending[0][1].end_ns <= self._now - self.config.lateness_ns
            or len(pending) > self.config.max_pending_gaps
        ):
            return self._release(self._now - self.config.lateness_ns)
        return []  # no gap is due (the usual event): _release would find none

    def flush(self) -> list[Attribution]:
        """End of stream: attribute every gap still held."""
        return self._release(None)

    def stats(self) -> EngineStats:
        return EngineStats(
            events=self._counts["events"],
            gaps=self._counts["gaps"],
            attributions=self._counts["attributions"],
            late_events=self._counts["late"],
            forced=self._counts["forced"],
            spans=self._size,
            threads=len(self._timelines),
            pending=len(self._pending),
            evicted=self._evicted,
            follow_cut=self._counts["follow_cut"],
        )

    def _on_span(self, ev: Any, rule: SpanRule, start: int, end: int) -> None:
        if ev.tid <= 0:
            return
        if end + self.config.lateness_ns <= self._now:
            self._counts["late"] += 1  # a gap ending with it may have gone out without it
        tl = self._timeline(ev.tid, ev.tgid)
        self._size += tl.add(rule, start, end, ev)
        self._heard[ev.tid] = self._now
        self._heard.move_to_end(ev.tid)
        if self._size > self.config.max_spans:
            self._evict_by_count()

    def _on_gap(self, gap: GpuGap) -> None:
        self._counts["gaps"] += 1
        insort(self._pending, ((gap.end_ns, gap.gpu, gap.ts_ns, content(gap)), gap))
        if len(self._pending) > self.config.max_pending_gaps:
            self._counts["forced"] += 1

    def _on_procs(self, ev: GpuProcesses) -> None:
        _remember(self._procs.setdefault(ev.gpu, []), (ev.ts_ns, tuple(sorted(ev.pids))))

    def _on_status(self, ev: ProbeStatus) -> None:
        _remember(self._probes.setdefault(ev.probe, []), (ev.ts_ns, ev.state))

    def _on_workload(self, ev: WorkloadInfo) -> None:
        """Remember a process's label; the oldest announcement goes first past the bound
        (in stream order, so that replay forgets what live forgot)."""
        self._workloads.pop(ev.tgid, None)
        self._workloads[ev.tgid] = label(ev.workload)
        if len(self._workloads) > self.config.max_workloads:
            del self._workloads[next(iter(self._workloads))]

    def _timeline(self, tid: int, tgid: int) -> Timeline:
        tl = self._timelines.get(tid)
        if tl is None:
            tl = self._timelines[tid] = Timeline(tid, tgid)
            tl.horizon = self._gone.pop(tid, 0)
            self._by_tgid.setdefault(tgid, set()).add(tid)
            tl.still_off(self._asleep.pop(tid, 0))
        return tl

    def _on_open(self, ev: OffCpuOpen) -> None:
        tl = self._timelines.get(ev.tid)
        if tl is not None:
            tl.still_off(ev.ts_ns)
        elif ev.tid > 0:
            self._asleep[ev.tid] = max(self._asleep.get(ev.tid, 0), ev.ts_ns)

    def _on_own(self, ev: OwnThreads) -> None:
        tgid, tids = self._own
        if tgid != ev.tgid:  # another gpujitter process (traces of two runs, one after another)
            tids = set()
        self._own = (ev.tgid, tids | set(ev.tids) | {ev.tgid})

    # -- memory bounds -------------------------------------------------------------------

    def _evict_by_age(self) -> None:
        self._last_evict = self._now
        cutoff = self._now - self.config.retention_ns
        self._asleep = {tid: since for tid, since in self._asleep.items() if since >= cutoff}
        self._gone = {tid: horizon for tid, horizon in self._gone.items() if horizon >= cutoff}
        for tid in sorted(self._timelines):
            tl = self._timelines[tid]
            removed = tl.evict_older(cutoff)
            self._size -= removed
            self._evicted += removed
            if (
                not any(tl.spans.values())
                and (not tl.places or tl.places[-1][0] < cutoff)
                and tl.open_since < cutoff  # asleep since lately: its record is to come
            ):
                self._drop_timeline(tl)

    def _evict_by_count(self) -> None:
        """Over the bound, until the total is a quarter under it (each time sorts every
        timeline: at a tenth under, beside 4000 threads, it came every ~7k events and took
        half the engine's time). Launchers (threads with CUDA calls: the feeding threads, whose
        timelines hold the evidence of the gaps still pending) go last: taking the largest
        timelines first once took it from them beside a crowd of other threads. First the
        other threads least lately heard of, whole, back to the lateness window (a pool of
        thousands, loader workers respawning); then the largest give up their oldest entries,
        the others' before the launchers'."""
        target = self.config.max_spans * 3 // 4
        recent = self._now - self.config.lateness_ns
        quiet, freed = [], 0
        for tid, heard in self._heard.items():
            if self._size - freed <= target or heard >= recent:
                break
            tl = self._timelines[tid]
            if not tl.launcher:
                quiet.append(tl)
                freed += tl.size
        for tl in quiet:
            self._drop_timeline(tl, gone=True)
        for launchers in (False, True):  # the launchers' only once the others' are gone
            while self._size > target:
                # a pass over the timelines as they stand, sorted once (a pass per entry
                # taken held the loop half a second among 120k threads); each gives up an
                # entry at least, or goes whole
                order = sorted(
                    (t for t in self._timelines.values() if t.launcher == launchers),
                    key=lambda t: (-t.size, t.tid),
                )
                if not order:
                    break
                for tl in order:
                    if self._size <= target:
                        break
                    if not any(tl.spans.values()):
                        self._drop_timeline(tl, gone=True)
                        continue
                    dropped = tl.drop_oldest(min(self._size - target, max(1, tl.size // 2)))
                    self._size -= dropped
                    self._evicted += dropped

    def _drop_timeline(self, tl: Timeline, gone: bool = False) -> None:
        """`gone`: dropped by count, not for its age: a thread that comes back starts a
        timeline with this one's horizon (what was evicted is said as evicted, not as no
        data)."""
        if gone:
            self._gone[tl.tid] = max(self._now, tl.horizon)
        self._size -= tl.size
        self._evicted += tl.size
        del self._timelines[tl.tid]
        self._heard.pop(tl.tid, None)
        tids = self._by_tgid.get(tl.tgid)
        if tids is not None:
            tids.discard(tl.tid)
            if not tids:
                del self._by_tgid[tl.tgid]

    # -- attribution ---------------------------------------------------------------------

    def _release(self, watermark: int | None) -> list[Attribution]:
        out = []
        while self._pending and (
            watermark is None
            or self._pending[0][1].end_ns <= watermark
            or len(self._pending) > self.config.max_pending_gaps
        ):
            _, gap = self._pending.pop(0)
            out.append(self.attribute(gap))
        self._counts["attributions"] += len(out)
        return out

    def attribute(self, gap: GpuGap) -> Attribution:
        """Attribute one gap with what the timelines hold now (feed() calls this once the
        watermark allows; drills and tests may call it directly)."""
        a, b = gap.ts_ns, max(gap.ts_ns, gap.end_ns)
        gpu_node = self._gpu_node(gap.gpu)
        tgids = tuple(sorted(gap.tgids)) or _at(self._procs.get(gap.gpu, []), b) or ()
        critical = self._critical(gap, tgids)
        divider = self._divider(gpu_node, b)
        divider.divide(critical, a, b)
        self._counts["follow_cut"] += divider.follow_cut
        parts, self_ns = _mark_own(self._parts(divider), self._own[1])
        tl = self._timelines.get(critical)
        # degraded probes still deliver their events (less of each): only the others are off
        probes_off = tuple(
            sorted(p for p, hist in self._probes.items() if _at(hist, b) not in _DELIVERING)
        )
        job_tids, job_cpus = self._job(parts, b, tgids, tl.tgid if tl else 0)
        rctx = RemedyContext(
            topology=self.topology,
            gpu_node=gpu_node,
            tgid=tl.tgid if tl else 0,
            feeding_cpus=tuple(sorted(tl.cpus_in(a, b))) if tl else (),
            probes_off=probes_off,
            job_tids=job_tids,
            job_cpus=job_cpus,
            others_cpus=self._others(gap.gpu, job_tids, b),
        )
        return Attribution(
            ts_ns=gap.ts_ns,
            end_ns=gap.end_ns,
            gpu=gap.gpu,
            sources=gap.sources,
            resolution_ns=gap.resolution_ns,
            confidence=gap.confidence,
            parts=parts,
            tgids=tgids,
            tid=critical,
            tgid=tl.tgid if tl else 0,
            comm=tl.comm if tl else "",
            gpu_node=-1 if gpu_node is None else gpu_node,
            threads=self._threads(gap, tgids, critical, divider, parts, gpu_node),
            remedies=self._remedies(parts, b - a, rctx),
            probes_off=probes_off,
            workload=next(
                (
                    self._workloads[t]
                    for t in (tl.tgid if tl else 0, *tgids)
                    if t in self._workloads
                ),
                "",
            ),
            self_ns=self_ns,
        )

    def _divider(self, gpu_node: int | None, gap_end: int, follow: bool = True) -> Divider:
        budget = self.config.waker_budget if follow else 0
        return Divider(
            self._timelines,
            self.topology,
            gpu_node,
            self.config,
            CAUSE_ORDER,
            gap_end,
            budget,
            self._workloads,
        )

    def _gpu_node(self, gpu: int) -> int | None:
        bus = self.config.gpu_bus_ids.get(gpu)
        if bus is not None and bus in self.topology.gpu_node:
            return self.topology.gpu_node[bus]
        # GPU -1 has no bus id; an override may still place it (from the trace header's
        # topology in replay, so replay places it as live did).
        if gpu == UNKNOWN_GPU and bus is None and self.topology.unknown_gpu_node is not None:
            return self.topology.unknown_gpu_node
        nodes = self.topology.nodes
        return nodes[0] if len(nodes) == 1 else None

    def _critical(self, gap: GpuGap, tgids: tuple[int, ...]) -> int:
        """The thread whose timeline is the gap's path: the one whose launch ended the gap,
        else the one that launched last before it (the first of these that left events),
        else the feeding processes' latest launcher, else a feeding process's main thread;
        0 when none is known."""
        named = [t for t in (gap.tid_after, gap.tid_before) if t]
        if named:
            return next((t for t in named if t in self._timelines), named[0])
        launches = [
            (s.start, tid)
            for tgid in tgids
            for tid in self._by_tgid.get(tgid, ())
            for s in self._timelines[tid].overlapping("cuda", 0, gap.end_ns + 1)
        ]
        if launches:
            return max(launches)[1]
        return next((t for t in tgids if t in self._timelines), 0)

    def _parts(self, divider: Divider) -> tuple[Part, ...]:
        parts = []
        for name, items in divider.tally.by_cause().items():
            cause = CAUSE_BY_NAME[name]
            parts.append(
                Part(
                    cause=name,
                    ns=sum(ns for _, _, ns in items),
                    tids=tuple(sorted({tid for tid, _, _ in items})),
                    evidence=cause.evidence(items, divider),
                )
            )
        parts.sort(key=lambda p: (-p.ns, CAUSES.index(p.cause)))
        return tuple(parts)

    def _job(
        self, parts: tuple[Part, ...], b: int, tgids: tuple[int, ...], tgid: int
    ) -> tuple[frozenset[int], tuple[int, ...]]:
        """The job, for the remedies, as the stream says it: the feeding processes' threads
        (the critical thread's process too, and the threads whose time the parts hold) and
        every CPU they ran or waited on up to the gap's end, so that no remedy moves other
        work onto them."""
        tids = {t for p in {*tgids, tgid} for t in self._by_tgid.get(p, ())}
        tids |= {t for p in parts for t in p.tids}
        return frozenset(tids), self._cpus_until(tids, b)

    def _others(self, gpu: int, job_tids: frozenset[int], b: int) -> tuple[int, ...]:
        """The CPUs the other GPUs' processes ran or waited on up to b (another rank of the
        job, another job): a remedy must not move this gap's competitor onto them."""
        tgids = {p for g, hist in self._procs.items() if g != gpu for p in _at(hist, b) or ()}
        tids = {t for p in tgids for t in self._by_tgid.get(p, ())} - job_tids
        return self._cpus_until(tids, b)

    def _cpus_until(self, tids: Iterable[int], b: int) -> tuple[int, ...]:
        cpus: set[int] = set()
        for t in tids:
            tl = self._timelines.get(t)
            if tl is not None:
                cpus |= tl.cpus_until(b)
        cpus.discard(-1)
        return tuple(sorted(cpus))

    def _remedies(
        self, parts: tuple[Part, ...], dur_ns: int, rctx: RemedyContext
    ) -> tuple[str, ...]:
        """One line per top cause, two at most: the top cause's, and the next one's where it
        holds at least config.remedy_min_pct of the gap."""
        lines: list[str] = []
        for i, part in enumerate(parts):
            if len(lines) == 2 or (i and part.ns * 100 < dur_ns * self.config.remedy_min_pct):
                break
            line = CAUSE_BY_NAME[part.cause].remedy(part, rctx)
            if line:
                lines.append(f"{part.cause}: {line}")
        return tuple(lines)

    def _threads(
        self,
        gap: GpuGap,
        tgids: tuple[int, ...],
        critical: int,
        divider: Divider,
        parts: tuple[Part, ...],
        gpu_node: int | None,
    ) -> tuple[ThreadRole, ...]:
        """The critical thread, the wakers its waits were followed into (those whose own
        time explains most first, so that a busy worker at the end of a chain is listed),
        and, as evidence only, the thread that launched before the gap and the feeding
        processes' other threads that left spans inside it, each with its own causes there."""
        a, b = gap.ts_ns, max(gap.ts_ns, gap.end_ns)
        roles = []
        if critical:
            # The whole gap is its path; its top cause is the attribution's, wherever it lay.
            top = parts[0].cause if parts else "unexplained"
            roles.append(
                self._role(critical, "critical", b - a, _own(divider.tally, critical), top)
            )
        wakers = []
        for tid, ns in divider.wakers.items():
            mine = _own(divider.tally, tid)
            role = self._role(tid, "waker", ns, mine, _top(mine)[0], divider.chain[tid])
            wakers.append(role)
        wakers.sort(key=lambda r: (-sum(c.ns for c in r.causes), r.tid))
        roles += wakers
        room = self.config.max_threads_listed - len(roles)
        seen = {critical, *divider.wakers}
        if room > 0 and gap.tid_before and gap.tid_before not in seen:
            roles.append(self._evidence(gap.tid_before, "before", a, b, gpu_node))
            seen.add(gap.tid_before)
            room -= 1
        # Siblings are listed by their time in the gap, then by tid; none holds more than the
        # whole gap, so once `room` of them hold all of it no later tid can be listed, and
        # the rest (a framework's idle pools, asleep through every gap) go undivided.
        ranked: list[tuple[int, int, ThreadRole]] = []
        whole = 0
        for tid in sorted({t for tgid in tgids for t in self._by_tgid.get(tgid, ())} - seen):
            if whole >= room:
                break
            tl = self._timelines[tid]
            if any(tl.overlapping(k, a, b) for k in CLAIMING_KINDS if k != "nodetime"):
                role = self._evidence(tid, "sibling", a, b, gpu_node)
                ranked.append((-role.ns, tid, role))
                whole += role.ns >= b - a
        ranked.sort(key=lambda r: r[:2])
        return tuple(roles + [r for _, _, r in ranked[: max(room, 0)]])

    def _evidence(self, tid: int, role: str, a: int, b: int, gpu_node: int | None) -> ThreadRole:
        """A thread listed as evidence only: its own time in [a, b), not followed."""
        own = self._divider(gpu_node, b, follow=False)
        own.divide(tid, a, b)
        mine = _own(own.tally, tid)
        cause, ns = _top(mine)
        return self._role(tid, role, ns, mine, cause)

    def _role(
        self,
        tid: int,
        role: str,
        ns: int,
        mine: dict[str, int],
        cause: str,
        chain: tuple[int, int] = (0, 0),
    ) -> ThreadRole:
        """A listed thread, with its own time per cause (mine) and its top cause."""
        tl = self._timelines.get(tid)
        return ThreadRole(
            tid=tid,
            tgid=tl.tgid if tl else 0,
            comm=tl.comm if tl else "",
            role=role,
            ns=ns,
            top_cause=cause,
            hops=chain[0],
            woke=chain[1],
            causes=tuple(
                CauseTime(c, n)
                for c, n in sorted(mine.items(), key=lambda cn: (-cn[1], CAUSES.index(cn[0])))
            ),
            workload=self._workloads.get(tl.tgid, "") if tl else "",
        )


def _mark_own(parts: tuple[Part, ...], own: set[int]) -> tuple[tuple[Part, ...], int]:
    """Parts with the evidence of gpujitter's own threads marked, and the time it holds: the
    gap's self-inflicted time."""
    if not own:
        return parts, 0
    marked: list[Part] = []
    self_ns = 0
    for part in parts:
        if not any(isinstance(e, TaskEvidence) and e.tid in own for e in part.evidence):
            marked.append(part)  # nothing to mark (evidence is made unmarked): no copy
            continue
        evidence = tuple(
            replace(e, own=True) if isinstance(e, TaskEvidence) and e.tid in own else e
            for e in part.evidence
        )
        self_ns += sum(e.ns for e in evidence if isinstance(e, TaskEvidence) and e.own)
        marked.append(replace(part, evidence=evidence))
    return tuple(marked), self_ns


def _own(tally: Tally, tid: int) -> dict[str, int]:
    """A thread's own time per cause in a tally."""
    mine: dict[str, int] = {}
    for (cause, t, _), ns in tally.claims.items():
        if t == tid:
            mine[cause] = mine.get(cause, 0) + ns
    return mine


def _top(mine: dict[str, int]) -> tuple[str, int]:
    """A thread's largest explained cause, from its time per cause (_own); unexplained only
    when nothing else."""
    explained = [(ns, -CAUSES.index(c), c) for c, ns in mine.items() if c != "unexplained"]
    if explained:
        ns, _, cause = max(explained)
        return cause, ns
    return "unexplained", mine.get("unexplained", 0)


def _remember(history: list[tuple[int, Any]], item: tuple[int, Any]) -> None:
    insort(history, item)
    del history[:-_HISTORY]


def _at(history: list[tuple[int, Any]], t: int) -> Any:
    """The value in force at t: the latest at or before t, else the earliest known."""
    i = bisect_right(history, t, key=itemgetter(0))  # history is sorted (_remember)
    if i:
        return history[i - 1][1]
    return history[0][1] if history else None
