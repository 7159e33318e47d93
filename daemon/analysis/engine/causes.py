"""The causes a gap's time is divided among, in precedence order: how each claims a segment
of a thread's time, what evidence it reports, and its one-line remedy (daemon/analysis/remedies.py).

Where causes overlap, the earlier in CAUSE_ORDER takes the time: a swap-in inside an off-CPU
interval is the swap-in, not "blocked"; IRQ time inside an allocator call is the IRQ's. The
reasoning for the order is in docs/attribution.md.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Iterable
from typing import Any, ClassVar

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.analysis.engine.divide import Divider, Segment
from gpujitter.daemon.analysis.engine.syscalls import SLEEPS, syscall_name
from gpujitter.daemon.analysis.engine.timeline import Span, Timeline
from gpujitter.daemon.analysis.records import (
    AllocEvidence,
    Attribution,
    Evidence,
    FaultEvidence,
    FrameEvidence,
    GcEvidence,
    GilEvidence,
    IdleEvidence,
    IoEvidence,
    IrqEvidence,
    MigrationEvidence,
    NodeEvidence,
    Part,
    ReasonEvidence,
    SyscallEvidence,
    TaskEvidence,
    cpus_text,
    task_name,
)
from gpujitter.daemon.analysis.remedies import RemedyContext
from gpujitter.probes.events import IrqStolen, OffCpu
from gpujitter.units import format_bytes, format_ns

Claimed = tuple[int, Any, int]  # (tid, key, ns)


class Cause(abc.ABC):
    """One row of the cause table. name: the wire name logs and sockets carry; label: how
    people read it (report, log one-liners, TUI, HTML); colour: its colour in every bar and
    legend (chosen to read on a dark terminal and on white)."""

    name: ClassVar[str]
    label: ClassVar[str]
    colour: ClassVar[str]

    @abc.abstractmethod
    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        """Take time from the segment (at most `remaining`) into divider's tally; return it."""

    @abc.abstractmethod
    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        """What the claimed items show, for the attribution's part."""

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        return None

    def detail(self, part: Part, attr: Attribution) -> str:
        """What the part's evidence names, in a few words (which IRQ, which task, which
        call) for the one-line summaries; "" when there is nothing to add to the label."""
        return ""


def _top(part: Part, cls: type[Any]) -> list[Any]:
    """The part's evidence of one kind, largest first."""
    return sorted((e for e in part.evidence if isinstance(e, cls)), key=lambda e: -e.ns)


def _fault_detail(part: Part, attr: Attribution) -> str:
    faults = _top(part, FaultEvidence)
    count = sum(f.count for f in faults)
    tids = ",".join(map(str, part.tids))
    # A waker's faults are named with the waker (describe.held_by), in its own process.
    who = f"pid {attr.tgid} tid {tids}" if part.tids and attr.holder(part) is None else ""
    what = f"{count} fault{'s' if count != 1 else ''}" if count else ""
    return ", ".join(x for x in (who, what) if x)


def _largest_first(evidence: Iterable[Evidence], tie: Callable[[Any], Any]) -> tuple[Any, ...]:
    return tuple(sorted(evidence, key=lambda e: (-e.ns, tie(e))))


def _group(items: list[Claimed], key: Callable[[Any], Hashable]) -> list[list[Claimed]]:
    """Claims grouped by key(span), groups in first-claimed order (deterministic)."""
    groups: dict[Hashable, list[Claimed]] = {}
    for item in items:
        groups.setdefault(key(item[1]), []).append(item)
    return list(groups.values())


def _cpus(group: list[Claimed], attr: str = "cpu") -> tuple[int, ...]:
    return tuple(sorted({getattr(span.event, attr) for _, span, _ in group}))


def _ns(group: list[Claimed]) -> int:
    return sum(ns for _, _, ns in group)


def _spans(group: list[Claimed]) -> int:
    """How many distinct intervals the group's claims came from."""
    return len({id(span) for _, span, _ in group})


def _scaled_count(group: list[Claimed]) -> int:
    """An aggregate's count in proportion to the time of it claimed (rounded up)."""
    n = 0
    for _, span, ns in group:
        total = span.event.total_ns
        n += span.event.count if total <= 0 else -(-span.event.count * min(ns, total) // total)
    return n


class ExactCause(Cause):
    """A cause backed by exact intervals: the first covering span takes all that remains."""

    kind: ClassVar[str]

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        spans = seg.active[self.kind]
        if not spans:
            return 0
        divider.add(self.name, seg.tl.tid, spans[0], remaining)
        return remaining


class WindowedCause(Cause):
    """A cause backed by in-kernel aggregates over a window (count, total time, first..last
    occurrence): each window's total is spread uniformly over the window's time in which the
    thread was not known to be off CPU, and only on-CPU segments can take it."""

    kind: ClassVar[str]

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        if seg.off is not None:
            return 0
        got = 0
        for span in seg.active[self.kind]:
            share = divider.share(seg.tl, span, span.event.total_ns, seg.start, seg.end)
            ns = min(remaining - got, share)
            divider.add(self.name, seg.tl.tid, span, ns)
            got += max(0, ns)
        seg.oncpu_claimed += got
        return got


class MajorFaultCause(ExactCause):
    def detail(self, part: Part, attr: Attribution) -> str:
        return _fault_detail(part, attr)

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        spans = sorted({id(s): s for _, s, _ in items}.values(), key=lambda s: s.start)
        return (
            FaultEvidence(
                kind=spans[0].event.kind,
                count=len(spans),
                ns=_ns(items),
                cpus=tuple(sorted({s.event.cpu for s in spans})),
                addresses=tuple(s.event.address for s in spans[: divider.config.max_addresses]),
            ),
        )


class SwapIn(MajorFaultCause):
    name = "swap_in"
    label = "swap-in"
    colour = "#d75f5f"
    kind = "swap"

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        return remedies.swappiness_at_most(10)


class FileFault(MajorFaultCause):
    name = "major_fault"
    label = "major faults (file)"
    colour = "#d7875f"
    kind = "major"

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        return remedies.page_cache_warm()


class IrqTime(WindowedCause):
    name = "irq"
    label = "IRQs"
    colour = "#d7af00"
    kind = "irq"

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        out = []
        for group in _group(items, lambda s: (s.event.irq_kind, s.event.irq, s.event.name)):
            ev: IrqStolen = group[0][1].event
            device = divider.topology.irq_node.get(ev.irq, -1) if ev.irq_kind == "hardirq" else -1
            out.append(
                IrqEvidence(
                    irq_kind=ev.irq_kind,
                    irq=ev.irq,
                    name=ev.name,
                    cpus=_cpus(group),
                    count=_scaled_count(group),
                    ns=_ns(group),
                    device_node=device,
                    remote_to_gpu=device >= 0 and divider.remote(device),
                    handled_remote=any(span.event.remote for _, span, _ in group),
                )
            )
        return _largest_first(out, lambda e: (e.irq_kind, e.irq, e.name))

    def detail(self, part: Part, attr: Attribution) -> str:
        irqs = _top(part, IrqEvidence)
        if not irqs:
            return ""
        top = irqs[0]
        remote = " (remote to GPU)" if top.remote_to_gpu else ""
        more = f" +{len(irqs) - 1} more" if len(irqs) > 1 else ""
        return f"{top.name}{cpus_text(top.cpus)}{remote}{more}"

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, IrqEvidence)
        return remedies.irq(top, ctx)


class MinorFaultTime(WindowedCause):
    name = "minor_faults"
    label = "minor faults"
    colour = "#afaf5f"
    kind = "minor"

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        return (
            FaultEvidence(
                kind="minor", count=_scaled_count(items), ns=_ns(items), cpus=_cpus(items)
            ),
        )

    def detail(self, part: Part, attr: Attribution) -> str:
        return _fault_detail(part, attr)

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, FaultEvidence)
        return remedies.minor_faults(top)


class IdleWakeDelay(ExactCause):
    """The wake-to-run delay of a wake-up onto an idle CPU; where the sched probe saw
    another task run during that wait, the wait is contention (runq_wait) instead."""

    name = "idle_wake"
    label = "wake-up from idle"
    colour = "#5fafd7"
    kind = "idle"

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        if seg.off is not None and seg.runq and seg.off.event.other_tid > 0:
            return 0
        return super().claim(seg, remaining, divider, depth, path)

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        out = []
        for group in _group(items, lambda s: (s.event.state, s.event.state_name)):
            ev = group[0][1].event
            out.append(
                IdleEvidence(
                    state=ev.state,
                    state_name=ev.state_name,
                    cpus=_cpus(group),
                    count=_spans(group),
                    ns=_ns(group),
                    exit_latency_ns=max(span.event.exit_latency_ns for _, span, _ in group),
                )
            )
        return _largest_first(out, lambda e: e.state)

    def detail(self, part: Part, attr: Attribution) -> str:
        states = _top(part, IdleEvidence)
        return f"from {states[0].state_name}{cpus_text(states[0].cpus)}" if states else ""

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, IdleEvidence)
        return remedies.idle_wake(top, ctx)


def cross_node_migrations(tl: Timeline, a: int, b: int, divider: Divider) -> list[Span]:
    return [m for m in tl.overlapping("migration", a, b + 1) if m.event.cross_node]


class RunqWait(Cause):
    name = "runq_wait"
    label = "run-queue wait"
    colour = "#af5fd7"

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        if seg.off is None or not seg.runq:
            return 0
        divider.add(self.name, seg.tl.tid, seg.off, remaining)
        return remaining

    def _migrations(self, tid: int, span: Span, divider: Divider) -> list[Span]:
        """Cross-node migrations that led into this wait: while it was off CPU, or shortly
        before (config.migration_window_ns)."""
        tl = divider.timelines[tid]
        return cross_node_migrations(
            tl, span.start - divider.config.migration_window_ns, span.end, divider
        )

    def _after_migration(self, tid: int, span: Span, divider: Divider) -> bool:
        ev: OffCpu = span.event
        moved = divider.node_of(ev.cpu) != divider.node_of(ev.cpu_in)
        return moved or bool(self._migrations(tid, span, divider))

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        tasks = []
        for group in _group(items, lambda s: (s.event.other_tid, s.event.other_comm)):
            ev = group[0][1].event
            tasks.append(
                TaskEvidence(
                    tid=ev.other_tid,
                    comm=ev.other_comm,
                    tgid=ev.other_tgid,
                    workload=divider.workloads.get(ev.other_tgid, ""),
                    cpus=_cpus(group, "cpu_in"),
                    count=_spans(group),
                    ns=_ns(group),
                    after_migration=any(self._after_migration(t, s, divider) for t, s, _ in group),
                )
            )
        moves = {
            (m.start, m.event.tid): m.event
            for tid, span, _ in items
            for m in self._migrations(tid, span, divider)
        }
        return _largest_first(tasks, lambda e: (e.tid, e.comm)) + migration_evidence(moves)

    def detail(self, part: Part, attr: Attribution) -> str:
        tasks = _top(part, TaskEvidence)
        if not tasks:
            return ""
        top = tasks[0]
        who = f"behind {task_name(top)}" if top.tid else "behind an unknown task"
        if top.own:
            who = f"behind gpujitter itself (tid {top.tid}, self-inflicted)"
        flag = ", after a cross-NUMA migration" if any(t.after_migration for t in tasks) else ""
        return f"{who}{cpus_text(top.cpus)}{flag}"

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, TaskEvidence)
        return remedies.runq_wait(top, ctx)


def migration_evidence(moves: dict[tuple[int, int], Any]) -> tuple[Evidence, ...]:
    return tuple(
        MigrationEvidence(
            at_ns=m.ts_ns,
            tid=m.tid,
            src_cpu=m.src_cpu,
            dst_cpu=m.dst_cpu,
            src_node=m.src_node,
            dst_node=m.dst_node,
        )
        for _, m in sorted(moves.items())
    )


class AllocStall(ExactCause):
    name = "alloc_stall"
    label = "allocator stall"
    colour = "#d75faf"
    kind = "alloc"

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        out = []
        for group in _group(items, _alloc_call):
            spans = {id(span): span.event for _, span, _ in group}.values()
            call, allocator = _alloc_call(group[0][1])
            out.append(
                AllocEvidence(
                    call=call,
                    allocator=allocator,
                    count=len(spans),
                    ns=_ns(group),
                    bytes=sum(getattr(e, "length", 0) or getattr(e, "size", 0) for e in spans),
                )
            )
        return _largest_first(out, lambda e: (e.call, e.allocator))

    def detail(self, part: Part, attr: Attribution) -> str:
        calls = _top(part, AllocEvidence)
        if not calls:
            return ""
        size = f" {format_bytes(calls[0].bytes)}" if calls[0].bytes else ""
        return f"{calls[0].call}{size} x{sum(c.count for c in calls)}"

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, AllocEvidence)
        return remedies.alloc_stall(top)


def _alloc_call(span: Span) -> tuple[str, str]:
    ev = span.event
    return (ev.syscall, "") if hasattr(ev, "syscall") else (ev.func, ev.allocator)


class IoWait(Cause):
    """The blocked part of an off-CPU interval that a block request's completion ended (the
    sched probe's io_dev): the thread slept uninterruptibly until the disk answered. Its
    waker is whoever the completion interrupted, so it is not followed."""

    name = "io_wait"
    label = "I/O wait"
    colour = "#00afaf"

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        if seg.off is None or seg.runq or not seg.off.event.io_dev:
            return 0
        divider.add(self.name, seg.tl.tid, seg.off, remaining)
        return remaining

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        disks = {d.dev: d for d in divider.topology.devices if d.dev}
        out = []
        key = lambda s: (s.event.io_dev, s.event.io_op, s.event.syscall)  # noqa: E731
        for group in _group(items, key):
            ev: OffCpu = group[0][1].event
            disk = disks.get(ev.io_dev)
            node = -1 if disk is None or disk.numa_node is None else disk.numa_node
            spans = {id(span): span.event for _, span, _ in group}.values()
            out.append(
                IoEvidence(
                    dev=ev.io_dev,
                    name=disk.name if disk else "",
                    node=node,
                    op=ev.io_op,
                    syscall=syscall_name(ev.syscall, divider.config.syscall_abi),
                    count=len(spans),
                    ns=_ns(group),
                    bytes=sum(e.io_bytes for e in spans),
                    remote_to_gpu=node >= 0 and divider.remote(node),
                )
            )
        return _largest_first(out, lambda e: (e.dev, e.op, e.syscall))

    def detail(self, part: Part, attr: Attribution) -> str:
        disks = _top(part, IoEvidence)
        if not disks:
            return ""
        top = disks[0]
        node = f" (node {top.node})" if top.node >= 0 else ""
        call = f" in {top.syscall}" if top.syscall else ""
        count = sum(d.count for d in disks)
        return f"{top.op or 'I/O'} on {top.name or top.dev}{node}{call} x{count}"

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, IoEvidence)
        gpu_node = -1 if ctx.gpu_node is None else ctx.gpu_node
        return remedies.io_wait(top.name or top.dev, top.op, top.node, gpu_node)


class Blocked(Cause):
    """Off CPU and not runnable, with no more specific cause. When a watched thread woke it
    (futex, pipe, socket: not a timed sleep), the wait is followed into the waker's timeline
    over the same stretch, and a waker's own waits into theirs, while the gap's analysis
    budget (config.waker_budget) lasts: what the waker's time went to is what the critical
    thread waited for. Only the waker's explained time replaces the wait."""

    name = "blocked"
    label = "blocked"
    colour = "#5f87af"

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        if seg.off is None or seg.runq:
            return 0
        ev: OffCpu = seg.off.event
        tid = seg.tl.tid
        waker = ev.waker_tid
        if (
            ev.state == "sleeping"
            and syscall_name(ev.syscall, divider.config.syscall_abi) not in SLEEPS
            and waker not in (0, tid)
            and waker not in path
            and waker in divider.timelines
            and divider.can_follow(depth)
            and remaining == seg.end - seg.start
        ):
            got = divider.divide(
                waker, seg.start, seg.end, depth=depth + 1, path=path | {tid}, explain_only=True
            )
            if got:
                divider.followed(waker, tid, depth + 1, got)
            remaining -= got
            divider.add(self.name, tid, seg.off, remaining)
            return got + remaining
        divider.add(self.name, tid, seg.off, remaining)
        return remaining

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        out = []
        for group in _group(items, lambda s: (s.event.state, s.event.syscall)):
            ev = group[0][1].event
            out.append(
                SyscallEvidence(
                    state=ev.state,
                    syscall=syscall_name(ev.syscall, divider.config.syscall_abi),
                    nr=ev.syscall,
                    count=_spans(group),
                    ns=_ns(group),
                )
            )
        return _largest_first(out, lambda e: (e.state, e.nr))

    def detail(self, part: Part, attr: Attribution) -> str:
        calls = _top(part, SyscallEvidence)
        return f"in {calls[0].syscall}" if calls and calls[0].syscall else ""

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, SyscallEvidence)
        return remedies.blocked_hint(top.syscall, top.state)


class GcPauseTime(Cause):
    """On-CPU time of a thread inside a CPython GC collection: carved out of what would be
    host work (or remote on-CPU time), after IRQs, faults and allocator calls inside the
    collection took theirs. With on-CPU windows (sched probe) it takes the thread's on-CPU
    share of the segment and leaves the rest unexplained, as host work would; without
    them the collection's exact interval is all there is, and it takes the segment."""

    name = "gc_pause"
    label = "Python GC pause"
    colour = "#87875f"

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        spans = seg.active["gc"]
        if not spans or seg.off is not None:
            return 0
        take = remaining
        if seg.active["nodetime"]:
            take = 0
            split = oncpu_split(seg, remaining, divider)
            for i, (node, cpu, ns) in enumerate(split):
                got = min(ns, remaining - take)
                split[i] = (node, cpu, ns - got)  # what stays for the on-CPU causes
                take += got
        divider.add(self.name, seg.tl.tid, spans[0], take)
        return take

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        out = []
        for group in _group(items, lambda s: s.event.generation):
            events = {id(span): span.event for _, span, _ in group}.values()
            collected = [e.collected for e in events]
            out.append(
                GcEvidence(
                    generation=group[0][1].event.generation,
                    count=len(events),
                    ns=_ns(group),
                    dur_ns=sum(e.dur_ns for e in events),
                    collected=-1 if min(collected) < 0 else sum(collected),
                )
            )
        return _largest_first(out, lambda e: e.generation)

    def detail(self, part: Part, attr: Attribution) -> str:
        gens = _top(part, GcEvidence)
        if not gens:
            return ""
        top = gens[0]
        gen = f"gen {top.generation}" if top.generation >= 0 else "generation unknown"
        count = sum(g.count for g in gens)
        return f"{gen}, {count} collection{'s' if count != 1 else ''} of {format_ns(top.dur_ns)}"

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, GcEvidence)
        return remedies.gc_pause(top)


class GilWaitTime(Cause):
    """Time a thread waited to take CPython's GIL (the python_gil probe's exact intervals),
    blocked or on CPU in between, but not its run-queue waits (CPU contention, earlier in
    the table). The wait is not followed into the holder's timeline as a blocked wait is
    into its waker's: the holder's own time over the same stretches is divided apart, and
    its largest cause says what the holder was doing (evidence only: the gap's time stays
    the wait's)."""

    name = "gil_wait"
    label = "Python GIL wait"
    colour = "#af875f"

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        spans = seg.active["gil"]
        if not spans or (seg.off is not None and seg.runq):
            return 0
        divider.add(self.name, seg.tl.tid, (spans[0], seg.start, seg.end), remaining)
        return remaining

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        out = []
        holder = lambda k: (k[0].event.holder_tid, k[0].event.holder_comm)  # noqa: E731
        for group in _group(items, holder):
            events = {id(span): span.event for _, (span, _, _), _ in group}.values()
            tid, comm = holder(group[0][1])
            own, frames = (
                holder_time(divider, tid, [(s, e) for _, (_, s, e), _ in group])
                if tid
                else ({}, {})
            )
            top = max(sorted(own.items()), key=lambda c: c[1], default=("", 0))
            func, file, line = ranked_frames(frames)[0][0] if frames else ("", "", 0)
            out.append(
                GilEvidence(
                    holder_tid=tid,
                    holder_comm=comm,
                    count=len(events),
                    ns=_ns(group),
                    dur_ns=sum(e.dur_ns for e in events),
                    holder_cause=top[0],
                    holder_cause_ns=top[1],
                    holder_func=func,
                    holder_file=file,
                    holder_line=line,
                )
            )
        return _largest_first(out, lambda e: (e.holder_tid, e.holder_comm))

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        top = part.evidence[0]
        assert isinstance(top, GilEvidence)
        return remedies.gil_wait(top)

    def detail(self, part: Part, attr: Attribution) -> str:
        holders = _top(part, GilEvidence)
        if not holders:
            return ""
        who = f"held by {holders[0].holder}" if holders[0].holder_tid else "holder unknown"
        return f"{who}, {sum(h.count for h in holders)}x"


def holder_time(
    divider: Divider, tid: int, stretches: list[tuple[int, int]]
) -> tuple[dict[str, int], dict[tuple[str, str, int], int]]:
    """Thread tid's own time over the stretches, by cause, divided apart from the gap's
    tally out of the same analysis budget; and the Python frames sampled in its host work
    there, with their counts."""
    scratch = Divider(
        divider.timelines, divider.topology, divider.gpu_node, divider.config, divider.causes,
        divider.gap_end, follow_budget=divider.follow_left, workloads=divider.workloads,
    )  # fmt: skip
    for a, b in stretches:
        scratch.divide(tid, a, b)
    divider.follow_left = scratch.follow_left
    out: dict[str, int] = {}
    for (cause, _, _), ns in scratch.tally.claims.items():
        out[cause] = out.get(cause, 0) + ns
    return out, sampled_frames(HostWork.name, [tid], scratch)


def oncpu_split(seg: Segment, remaining: int, divider: Divider) -> list[tuple[int, int, int]]:
    """The segment's on-CPU time as (node, cpu, ns): the per-node on-CPU windows' uniform
    share, less what IRQs and faults already took (they ran on CPU too). The node is the
    one of the CPU the thread was last placed on when the windows confirm that node, else the
    windows' per-node proportions (cpu -1)."""
    if seg.oncpu is not None:
        return seg.oncpu
    seg.oncpu = []
    windows = seg.active["nodetime"]
    if seg.off is not None or not windows:
        return seg.oncpu
    per_node: dict[int, int] = {}
    total = 0
    for w in windows:
        ns = divider.share(seg.tl, w, sum(n for _, n in w.event.node_ns), seg.start, seg.end)
        total += ns
        for node, n in w.event.node_ns:
            per_node[node] = per_node.get(node, 0) + n
    budget = max(0, min(total - seg.oncpu_claimed, remaining))
    if budget == 0:
        return seg.oncpu
    cpu = seg.tl.cpu_at(seg.start)
    if cpu is not None and per_node.get(divider.node_of(cpu), 0) > 0:
        seg.oncpu = [(divider.node_of(cpu), cpu, budget)]
        return seg.oncpu
    weight = sum(per_node.values())
    done = 0
    acc = 0
    for node in sorted(per_node):
        acc += per_node[node]
        upto = budget * acc // weight
        if upto > done:
            seg.oncpu.append((node, -1, upto - done))
        done = upto
    return seg.oncpu


class OnCpuCause(Cause):
    remote: ClassVar[bool]

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        got = 0
        for node, cpu, ns in oncpu_split(seg, remaining, divider):
            if divider.remote(node) == self.remote:
                take = min(ns, remaining - got)
                divider.add(self.name, seg.tl.tid, (node, cpu), take)
                got += take
        return got

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        nodes: dict[int, tuple[set[int], int]] = {}
        for _, (node, cpu), ns in items:
            cpus, total = nodes.get(node, (set(), 0))
            if cpu >= 0:
                cpus.add(cpu)
            nodes[node] = (cpus, total + ns)
        return _largest_first(
            (
                NodeEvidence(node=n, cpus=tuple(sorted(c)), ns=ns, remote=self.remote)
                for n, (c, ns) in nodes.items()
            ),
            lambda e: e.node,
        )


class RemoteOnCpu(OnCpuCause):
    name = "remote_oncpu"
    label = "on-CPU on a remote node"
    colour = "#ff5f00"
    remote = True

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        """Nodes, and the cross-node migrations that put the threads there (the last one of
        each thread before its remote time)."""
        moves = {}
        for tid in sorted({tid for tid, _, _ in items}):
            cross = cross_node_migrations(divider.timelines[tid], 0, divider.gap_end, divider)
            remote = [m for m in cross if divider.remote(m.event.dst_node)]
            if remote:
                moves[(remote[-1].start, tid)] = remote[-1].event
        return super().evidence(items, divider) + migration_evidence(moves)

    def detail(self, part: Part, attr: Attribution) -> str:
        nodes = _top(part, NodeEvidence)
        gpu = f", GPU on node {attr.gpu_node}" if attr.gpu_node >= 0 else ""
        return f"node {nodes[0].node}{gpu}" if nodes else ""

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        return remedies.bind_to_gpu(ctx)


class HostWork(OnCpuCause):
    """Local on-CPU time; where the python_stacks probe sampled the thread inside it, the
    Python functions it was in (FrameEvidence, the TOP_FRAMES most sampled)."""

    name = "host_work"
    label = "host work"
    colour = "#5faf5f"
    remote = False

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        got = super().claim(seg, remaining, divider, depth, path)
        if got:
            divider.note(self.name, seg.tl.tid, seg.tl.overlapping("pysample", seg.start, seg.end))
        return got

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        return super().evidence(items, divider) + frame_evidence(self.name, items, divider)

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        return remedies.host_work_hint()

    def detail(self, part: Part, attr: Attribution) -> str:
        frames = _top(part, FrameEvidence)
        return f"in {frames[0].where} {frames[0].share}" if frames else ""


TOP_FRAMES = 3


def frame_evidence(cause: str, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
    """The functions most sampled in a part's time (the others are left out; `of` still
    counts them), each with the part's time in proportion."""
    counts = sampled_frames(cause, sorted({tid for tid, _, _ in items}), divider)
    total = sum(counts.values())
    ns = _ns(items)
    top = ranked_frames(counts)[:TOP_FRAMES]
    return tuple(
        FrameEvidence(func=f, file=file, line=line, samples=n, of=total, ns=ns * n // total)
        for (f, file, line), n in top
    )


def ranked_frames(
    counts: dict[tuple[str, str, int], int],
) -> list[tuple[tuple[str, str, int], int]]:
    """Sampled frames, the most sampled first (ties by function, file, line): the one order
    that host work's frames and a GIL holder's frame are named in."""
    return sorted(counts.items(), key=lambda kc: (-kc[1], kc[0]))


def sampled_frames(
    cause: str, tids: list[int], divider: Divider
) -> dict[tuple[str, str, int], int]:
    """(function, file, line) -> how many of the threads' samples the cause's time held."""
    counts: dict[tuple[str, str, int], int] = {}
    for tid in tids:
        for span in divider.notes.get((cause, tid), ()):
            key = (span.event.func, span.event.file, span.event.line)
            counts[key] = counts.get(key, 0) + 1
    return counts


class Unexplained(Cause):
    """Time no other cause claims. Why, per segment: no_data (no on-CPU windows cover it:
    the sched probe was off, or the thread left no trace), short_offcpu (on-CPU windows
    cover it, but the thread ran less than the time not otherwise explained: it was off CPU
    in stretches below the sched probe's threshold), evicted (older than the timeline's
    retained history)."""

    name = "unexplained"
    label = "unexplained"
    colour = "#808080"

    def claim(
        self, seg: Segment, remaining: int, divider: Divider, depth: int, path: frozenset[int]
    ) -> int:
        if seg.start < seg.tl.horizon:
            reason = "evicted"
        elif seg.active["nodetime"]:
            reason = "short_offcpu"
        else:
            reason = "no_data"
        divider.add(self.name, seg.tl.tid, (reason,), remaining)
        return remaining

    def evidence(self, items: list[Claimed], divider: Divider) -> tuple[Evidence, ...]:
        reasons: dict[str, int] = {}
        for _, (reason,), ns in items:
            reasons[reason] = reasons.get(reason, 0) + ns
        return _largest_first(
            (ReasonEvidence(reason=r, ns=ns) for r, ns in reasons.items()), lambda e: e.reason
        )

    def remedy(self, part: Part, ctx: RemedyContext) -> str | None:
        return remedies.enable_probes(ctx.probes_off) if ctx.probes_off else None


# The cause table, in precedence order: the only list of causes (the engine divides by it;
# report, describe, the TUI and the HTML report read names, labels and colours from it).
CAUSE_ORDER: tuple[Cause, ...] = (
    SwapIn(),
    FileFault(),
    IdleWakeDelay(),
    IrqTime(),
    MinorFaultTime(),
    RunqWait(),
    AllocStall(),
    IoWait(),
    GilWaitTime(),
    Blocked(),
    GcPauseTime(),
    RemoteOnCpu(),
    HostWork(),
    Unexplained(),
)
CAUSE_BY_NAME = {c.name: c for c in CAUSE_ORDER}

# The wire contract: the names logs and sockets carry, in precedence order.
CAUSES = tuple(c.name for c in CAUSE_ORDER)


def cause_rank(name: str) -> int:
    """Where a cause sorts (precedence order); a name from a newer writer sorts last."""
    return CAUSES.index(name) if name in CAUSE_BY_NAME else len(CAUSES)


def cause_label(name: str) -> str:
    """How people read a cause; a name this version does not know reads as itself."""
    cause = CAUSE_BY_NAME.get(name)
    return cause.label if cause else name.replace("_", " ")


def cause_colour(name: str) -> str:
    cause = CAUSE_BY_NAME.get(name)
    return cause.colour if cause else "#87afaf"
