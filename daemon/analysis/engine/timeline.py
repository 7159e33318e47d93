"""Per-thread timelines: what the probes reported about each watched thread, as time spans
indexed by start, so that any window (a gap) can be read back. Bounded by age (the engine
evicts spans that ended before its retention horizon) and by count (quiet threads whole,
then the largest timelines' oldest spans, the launchers' last: engine.py).

Ordering never depends on arrival order: spans sort by (start, end) and, on a tie, by their
event's content, so any interleaving of the same events builds the same timeline.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from gpujitter.probes.events import (
    AllocCall,
    AllocSyscall,
    CudaCall,
    Event,
    GcPause,
    GilWait,
    IdleWake,
    IrqStolen,
    MajorFault,
    Migration,
    MinorFaults,
    NodeTime,
    OffCpu,
    PySample,
)

# Span kinds, one list each per timeline once it holds one. Windowed kinds (irq, minor,
# nodetime) are in-kernel aggregates whose time is spread over their window; the others are
# exact intervals. Two more hold points (start == end): migration and pysample.
KINDS = ("offcpu", "swap", "major", "irq", "minor", "idle", "alloc", "gc", "nodetime", "cuda",
         "gil")  # fmt: skip
_PLACES = ""  # place points, beside the span kinds, in drop_oldest's merge


@dataclass(eq=False, slots=True)
class Span:
    start: int
    end: int
    event: Any  # the probe event behind it (typed per kind)


def _bounds(ev: Any, dur_ns: int) -> tuple[int, int]:
    return ev.ts_ns, ev.ts_ns + max(0, dur_ns)


def _window(ev: Any) -> tuple[int, int]:
    # An aggregate covers first..last occurrence; its total time can exceed that stretch
    # (one long handler, or end_ns marking the last one's start), so the window is widened
    # to hold at least total_ns.
    return ev.ts_ns, max(ev.end_ns, ev.ts_ns + ev.total_ns)


def _at(ev: Any) -> tuple[tuple[int, int, int], ...]:
    return ((ev.ts_ns, ev.cpu, ev.cpu),)


@dataclass(frozen=True, slots=True)
class SpanRule:
    """How one event type enters a timeline: its span kind (`kind_of` where the event
    decides it) and bounds, and the place points it gives, (time, CPU before, CPU after),
    that tell where the thread ran around an instant (None: none). The constant kind and the
    absent places cost no call: most events the daemon takes enter a timeline."""

    kind: str
    bounds: Callable[[Any], tuple[int, int]]
    places: Callable[[Any], tuple[tuple[int, int, int], ...]] | None = None
    kind_of: Callable[[Any], str] | None = None


# The registry of what enters a timeline.
SPAN_RULES: dict[type[Event], SpanRule] = {
    OffCpu: SpanRule(
        "offcpu",
        lambda e: (e.ts_ns, max(e.ts_ns, e.end_ns)),
        lambda e: ((e.ts_ns, e.cpu, e.cpu), (e.end_ns, e.cpu_in, e.cpu_in)),
    ),
    MajorFault: SpanRule(
        "major",
        lambda e: _bounds(e, e.dur_ns),
        _at,
        kind_of=lambda e: "swap" if e.kind == "swap" else "major",
    ),
    IrqStolen: SpanRule("irq", _window),
    MinorFaults: SpanRule("minor", _window),
    IdleWake: SpanRule(
        "idle",
        lambda e: _bounds(e, e.wake_to_run_ns),
        lambda e: ((e.ts_ns + e.wake_to_run_ns, e.cpu, e.cpu),),
    ),
    AllocSyscall: SpanRule("alloc", lambda e: _bounds(e, e.dur_ns), _at),
    AllocCall: SpanRule("alloc", lambda e: _bounds(e, e.dur_ns), _at),
    # The probe reads the CPU as the collection ends.
    GcPause: SpanRule(
        "gc", lambda e: _bounds(e, e.dur_ns), lambda e: ((e.ts_ns + e.dur_ns, e.cpu, e.cpu),)
    ),
    GilWait: SpanRule("gil", lambda e: _bounds(e, e.dur_ns)),
    NodeTime: SpanRule("nodetime", lambda e: _bounds(e, e.interval_ns)),
    Migration: SpanRule(
        "migration", lambda e: (e.ts_ns, e.ts_ns), lambda e: ((e.ts_ns, e.src_cpu, e.dst_cpu),)
    ),
    CudaCall: SpanRule("cuda", lambda e: _bounds(e, e.dur_ns), _at),
    PySample: SpanRule("pysample", lambda e: (e.ts_ns, e.ts_ns)),
}


def content(ev: Event) -> tuple[Any, ...]:
    """A total order among events of one kind that does not depend on when they arrived."""
    return (ev.KIND, *(getattr(ev, f.name) for f in fields(ev)))


def _span_bounds(span: Span) -> tuple[int, int]:
    return span.start, span.end


def _insert(spans: list[Span], span: Span) -> int:
    """Put a span that arrived out of order in its place; returns where it went."""
    key = (span.start, span.end)
    pos = bisect_right(spans, key, key=_span_bounds)
    if pos and _span_bounds(spans[pos - 1]) == key:
        lo = bisect_left(spans, key, key=_span_bounds)
        mine = content(span.event)
        while lo < pos and content(spans[lo].event) <= mine:
            lo += 1
        pos = lo
    spans.insert(pos, span)
    return pos


class Timeline:
    """One thread's spans by kind, each list sorted, plus the CPUs it was seen on."""

    __slots__ = (
        "_comm_ts", "_first", "_first_by", "_starts", "comm", "horizon", "longest",
        "open_since", "places", "spans", "tgid", "tid",
    )  # fmt: skip

    def __init__(self, tid: int, tgid: int) -> None:
        self.tid = tid
        self.tgid = tgid
        self.comm = ""
        self._comm_ts = -1
        # A list per kind from the kind's first span on: most threads hold one or two kinds,
        # and a list of each for every thread made a thread's timeline 3 KB before its first
        # span (a job starting 500 threads a second: 30k of them in the retention, 100 MB).
        self.spans: dict[str, list[Span]] = {}
        # Each list's starts, in step with it (every change to a list here changes both):
        # bisected without a key function, which a window's read of every kind costs.
        self._starts: dict[str, list[int]] = {}
        self.longest: dict[str, int] = {}
        self.places: list[tuple[int, int, int]] = []
        # Each CPU of the places with the time of its first place point: every remedy asks
        # which CPUs the job's threads were seen on, and a scan of the places is their length.
        self._first: dict[int, int] = {}
        # No time in _first is later than this: past it, every CPU there was seen already,
        # which is what a gap's remedies ask of each of the job's threads.
        self._first_by = 0
        # Spans ending before this may have been evicted: time there is not known.
        self.horizon = 0
        # The start of the latest off-CPU interval announced still open (OffCpuOpen), 0: none
        # (open_off says whether it still holds).
        self.open_since = 0

    def add(self, rule: SpanRule, start: int, end: int, ev: Event) -> int:
        """Store one event as [start, end); returns how many entries (spans and place
        points) it added."""
        comm = getattr(ev, "comm", "")
        if comm and ev.ts_ns >= self._comm_ts:
            self.comm, self._comm_ts = comm, ev.ts_ns
        kind = rule.kind if rule.kind_of is None else rule.kind_of(ev)
        spans = self.spans.get(kind)
        if spans is None:
            spans = self.spans[kind] = []
            self._starts[kind], self.longest[kind] = [], 0
        last = spans[-1] if spans else None
        if last is None or last.start < start or (last.start == start and last.end < end):
            spans.append(Span(start, end, ev))  # the usual case: in (start, end) order
            self._starts[kind].append(start)
        else:
            self._starts[kind].insert(_insert(spans, Span(start, end, ev)), start)
        if end - start > self.longest[kind]:
            self.longest[kind] = end - start
        if rule.places is None:
            return 1
        points = rule.places(ev)
        places, first = self.places, self._first
        for p in points:
            if not places or places[-1] <= p:
                places.append(p)
            else:
                places.insert(bisect_right(places, p), p)
            for cpu in p[1:]:
                if first.get(cpu, p[0] + 1) > p[0]:
                    first[cpu] = p[0]
                    self._first_by = max(self._first_by, p[0])
        return 1 + len(points)

    def still_off(self, since: int) -> None:
        """The thread has been off CPU since `since` and still was when read (OffCpuOpen)."""
        self.open_since = max(self.open_since, since)

    def open_off(self) -> int:
        """The start of the interval announced open, while nothing has closed it: its own
        OffCpu (the same start), or any span that starts later (the thread ran again, its
        OffCpu lost or under the threshold); 0: none. Asked of what the timeline holds, so
        the answer does not depend on the order in which the events came."""
        since = self.open_since
        if not since or any(spans and spans[-1].start > since for spans in self.spans.values()):
            return 0
        offcpu = self.spans.get("offcpu")
        return 0 if offcpu and offcpu[-1].start == since else since

    @property
    def launcher(self) -> bool:
        """Whether it holds CUDA calls (a thread that feeds a GPU)."""
        return bool(self.spans.get("cuda"))

    @property
    def size(self) -> int:
        return sum(map(len, self.spans.values())) + len(self.places)

    def overlapping(self, kind: str, a: int, b: int) -> list[Span]:
        """Spans of `kind` that share time with [a, b); points inside [a, b)."""
        spans = self.spans.get(kind)
        if not spans:
            return []  # most kinds of most threads: asked for each kind at every division
        starts = self._starts[kind]
        hi = bisect_left(starts, b)
        lo = bisect_left(starts, a - self.longest[kind], 0, hi)
        return [
            s
            for s in spans[lo:hi]
            if s.end > a or (s.start == s.end and s.start >= a)  # points at a count
        ]

    def cpu_at(self, t: int) -> int | None:
        """The CPU the thread ran on at t: after the last place point before t, else before
        the first one after it; None when nothing places the thread."""
        i = bisect_right(self.places, (t, 1 << 62, 1 << 62))
        if i:
            return self.places[i - 1][2]
        return self.places[0][1] if self.places else None

    def cpus_in(self, a: int, b: int) -> set[int]:
        """CPUs the thread ran or waited on during [a, b]."""
        lo = bisect_left(self.places, (a, -1, -1))
        hi = bisect_right(self.places, (b, 1 << 62, 1 << 62))
        cpus = {c for _, before, after in self.places[lo:hi] for c in (before, after)}
        at = self.cpu_at(a)
        return cpus if at is None else cpus | {at}

    def cpus_until(self, b: int) -> set[int]:
        """CPUs the thread ran or waited on up to b (cpus_in(0, b)), without a scan."""
        if not self.places:
            return set()
        if b >= self._first_by:
            cpus = set(self._first)  # every CPU the thread was seen on
        else:
            cpus = {c for c, t in self._first.items() if t <= b}
        cpus.add(self.places[0][1])
        return cpus

    def _drop_places(self, k: int) -> None:
        """Drop the k oldest place points. Only the CPUs first seen among them need a new
        first time: the scan of what is left stops once each is found again (a thread's CPUs
        come back soon), and a CPU not found leaves. Rebuilding the map from every point left
        cost each eviction (once a second) a scan of the retention's whole window per thread:
        2.1 ms for a thread with 300 points a second, against 0.08 ms now, and the daemon's
        CPU rose by half over its first two minutes (docs/performance.md)."""
        until = self.places[k - 1][0]
        del self.places[:k]
        first = self._first
        moved = {c for c, t in first.items() if t <= until}
        for c in moved:
            del first[c]
        for t, before, after in self.places:
            if not moved:
                break
            for c in (before, after):
                if c in moved:
                    moved.discard(c)
                    first[c] = t
                    self._first_by = max(self._first_by, t)

    def evict_older(self, cutoff: int) -> int:
        """Drop spans that ended before cutoff (from the front of each list: a long span holds
        later ones until it goes) and place points before it, keeping the last of those so
        the thread's CPU stays known. Returns the entries removed."""
        removed = 0
        for kind, spans in self.spans.items():
            n, count = 0, len(spans)
            while n < count and spans[n].end < cutoff:
                n += 1
            if n:
                self.horizon = max(self.horizon, *[s.end for s in spans[:n]])
                del spans[:n]
                del self._starts[kind][:n]
                removed += n
        keep_from = bisect_left(self.places, (cutoff, -1, -1)) - 1
        if keep_from > 0:
            self._drop_places(keep_from)
            removed += keep_from
        return removed

    def drop_oldest(self, n: int) -> int:
        """Drop the n oldest entries, spans of any kind and place points by their times
        (count-based eviction); the last place point stays, so the thread's CPU stays
        known. Returns how many went."""
        # zip binds each kind as its list is taken ((start, k) in a generator read the
        # loop's last kind when consumed: every entry was counted against one list, and
        # nothing was dropped while the engine's count went down)
        starts = self._starts
        lists = [zip(starts[k], itertools.repeat(k)) for k, spans in self.spans.items() if spans]
        places = self.places
        if len(places) > 1:
            times = (p[0] for p in itertools.islice(places, len(places) - 1))
            lists.append(zip(times, itertools.repeat(_PLACES)))
        counts: dict[str, int] = {}
        for _, kind in itertools.islice(heapq.merge(*lists), n):
            counts[kind] = counts.get(kind, 0) + 1
        placed = counts.pop(_PLACES, 0)
        if placed:
            self._drop_places(placed)
        for kind, k in counts.items():
            spans = self.spans[kind]
            self.horizon = max([self.horizon, *(s.end for s in spans[:k])])
            del spans[:k]
            del self._starts[kind][:k]
        return sum(counts.values()) + placed
