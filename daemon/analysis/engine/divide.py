"""The precedence sweep: one thread's time inside a window, divided among causes.

The window is cut at every span edge (and at run-queue starts, migrations and the eviction
horizon), so that inside each segment every span either covers it whole or not at all. The
causes, in precedence order (causes.py), then claim the segment's time in turn until none is
left: an exact span (a swap-in, an off-CPU interval) takes all that remains; a windowed
aggregate (IRQ, minor faults, per-node on-CPU time) takes its uniform share. Integer
nanoseconds throughout, so the parts add up to the window exactly.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from operator import sub
from typing import TYPE_CHECKING, Any

from gpujitter.daemon.analysis.engine.timeline import KINDS, Span, Timeline
from gpujitter.probes.topology import Topology

if TYPE_CHECKING:
    from gpujitter.daemon.analysis.engine.causes import Cause
    from gpujitter.daemon.analysis.engine.engine import EngineConfig

# Spans that claim time (cuda calls only say who launched; migrations are points).
CLAIMING_KINDS = tuple(k for k in KINDS if k != "cuda")
# Wakers of wakers are followed while the gap's budget lasts; this only keeps a pathological
# chain (every hop a thread not yet on it) from exhausting the interpreter's stack.
MAX_HOPS = 32


@dataclass(slots=True)
class Segment:
    """A stretch of one thread's time that every span either covers whole or misses."""

    start: int
    end: int
    tl: Timeline
    active: dict[str, tuple[Span, ...]]  # every claiming kind, () where none is active
    off: Span | None  # the off-CPU interval covering it, if any
    runq: bool  # inside that interval's run-queue wait (else its blocked part)
    oncpu_claimed: int = 0  # windowed on-CPU causes' share so far (IRQ, minor faults)
    oncpu: list[tuple[int, int, int]] | None = None  # (node, cpu, ns), computed once


@dataclass(slots=True)
class Tally:
    """Claimed time per (cause, thread, key): key is the span that explains it or a tuple."""

    claims: dict[tuple[str, int, Any], int] = field(default_factory=dict)

    def add(self, cause: str, tid: int, key: Any, ns: int) -> None:
        if ns > 0:
            k = (cause, tid, key)
            self.claims[k] = self.claims.get(k, 0) + ns

    def by_cause(self) -> dict[str, list[tuple[int, Any, int]]]:
        out: dict[str, list[tuple[int, Any, int]]] = {}
        for (cause, tid, key), ns in self.claims.items():
            out.setdefault(cause, []).append((tid, key, ns))
        return out


class Divider:
    """Divides threads' time for one gap; holds what the causes need to see."""

    def __init__(
        self,
        timelines: Mapping[int, Timeline],
        topology: Topology,
        gpu_node: int | None,
        config: EngineConfig,
        causes: Sequence[Cause],
        gap_end: int,
        follow_budget: int = 0,
        workloads: Mapping[int, str] | None = None,
    ) -> None:
        self.timelines = timelines
        self.workloads = workloads or {}  # tgid -> workload label (meta.workload)
        self.topology = topology
        self.gpu_node = gpu_node
        self.config = config
        self.causes = causes
        self.gap_end = gap_end
        self.tally = Tally()
        self.wakers: dict[int, int] = {}  # waker tid -> its explained time on the path
        # Waker tid -> (hops from the critical thread, the thread whose wait it ended), as
        # first reached in the sweep.
        self.chain: dict[int, tuple[int, int]] = {}
        # Work that following wakers may still do for this gap, in segments swept (and one
        # per stretch read): the analysis budget, counted in work rather than wall time so
        # that replay gives what live gave.
        self.follow_left = follow_budget
        self.follow_cut = False  # a wait was left unfollowed because the budget ran out
        # What causes noted beside their time, for their evidence: (cause, tid) -> items.
        self.notes: dict[tuple[str, int], list[Any]] = {}
        # Per window (by id: the divider lives for one gap, the spans longer): its off-CPU
        # intervals, indexed for the shares of it that the segments take.
        self._offcpu: dict[int, OffCpuIndex] = {}

    def add(self, cause: str, tid: int, key: Any, ns: int) -> None:
        self.tally.add(cause, tid, key, ns)

    def note(self, cause: str, tid: int, items: list[Any]) -> None:
        if items:
            self.notes.setdefault((cause, tid), []).extend(items)

    def divide(
        self,
        tid: int,
        a: int,
        b: int,
        *,
        depth: int = 0,
        path: frozenset[int] = frozenset(),
        explain_only: bool = False,
    ) -> int:
        """Claim thread tid's time in [a, b) into the tally; returns the time claimed. With
        explain_only (following a waker), time no cause explains is left unclaimed."""
        if b <= a:
            return 0
        tl = self.timelines.get(tid)
        if tl is None:
            if not explain_only:
                self.add("unexplained", tid, ("no_thread" if tid == 0 else "no_data",), b - a)
                return b - a
            return 0
        spans = [
            (k, s)
            for k in CLAIMING_KINDS
            if tl.spans.get(k)  # most kinds of most threads hold nothing: no call for them
            for s in tl.overlapping(k, a, b)
            if s.end > s.start
        ]
        spans.sort(key=_span_start)  # stable: kind, then content order on ties
        cuts = _cuts(tl, spans, a, b)
        if explain_only:
            # A stretch followed costs its segments and one more for reading its spans.
            if len(cuts) > self.follow_left:
                self.follow_cut = True
                return 0
            self.follow_left -= len(cuts)
        claimed = 0
        active: list[tuple[str, Span]] = []
        i = 0
        for s, e in pairwise(cuts):
            while i < len(spans) and spans[i][1].start <= s:
                active.append(spans[i])
                i += 1
            active = [ks for ks in active if ks[1].end > s]
            seg = _segment(tl, s, e, active)
            remaining = e - s
            for cause in self.causes:
                if remaining <= 0 or (explain_only and cause.name == "unexplained"):
                    break
                remaining -= cause.claim(seg, remaining, self, depth, path)
            claimed += (e - s) - remaining
        return claimed

    def can_follow(self, depth: int) -> bool:
        """May a wait at `depth` hops from the critical thread be followed into its waker?"""
        return depth < MAX_HOPS and self.follow_left > 0

    def followed(self, waker: int, woke: int, hops: int, ns: int) -> None:
        """Note that `waker`'s timeline explained ns of the wait of `woke`."""
        self.wakers[waker] = self.wakers.get(waker, 0) + ns
        self.chain.setdefault(waker, (hops, woke))

    def share(self, tl: Timeline, window: Span, total_ns: int, s: int, e: int) -> int:
        """The part of a windowed aggregate's total that falls in [s, e): spread uniformly over
        the window's time in which the thread was not known to be off CPU (the only time in
        which it can have taken IRQs or faults, or run). Telescoped over cumulative eligible
        time, so a window's segments add up to its total without rounding loss."""
        if total_ns <= 0:
            return 0
        index = self._offcpu.get(id(window))
        if index is None:
            index = self._offcpu[id(window)] = _offcpu_index(tl, window)
        full = index.eligible
        if full <= 0:  # contradicting sched data: fall back to the plain window length
            full = window.end - window.start
            upto_s, upto_e = _clip(window, s) - window.start, _clip(window, e) - window.start
        else:
            upto_s = index.eligible_until(_clip(window, s))
            upto_e = index.eligible_until(_clip(window, e))
        return total_ns * upto_e // full - total_ns * upto_s // full

    def node_of(self, cpu: int) -> int:
        return self.topology.node_of(cpu)

    def remote(self, node: int) -> bool:
        return self.gpu_node is not None and node != self.gpu_node


@dataclass(slots=True)
class OffCpuIndex:
    """A window's off-CPU intervals, clipped to it: starts, ends, the time off before each,
    and the window's eligible time (not known off CPU), which every share of it divides by."""

    start: int  # the window's
    starts: list[int]
    ends: list[int]
    before: list[int]
    eligible: int

    def eligible_until(self, x: int) -> int:
        """Time in [window start, x) in which the thread was not known to be off CPU; x
        inside the window."""
        i = bisect_right(self.starts, x)  # off-CPU intervals that began by x
        off = self.before[i] - (max(0, self.ends[i - 1] - x) if i else 0)
        return (x - self.start) - off


def _offcpu_index(tl: Timeline, window: Span) -> OffCpuIndex:
    a, b = window.start, window.end
    spans = tl.overlapping("offcpu", a, b)
    # Clipped to the window, without a call per interval (every share of a window that a gap
    # reads builds this): starts before it are a prefix (spans sort by start), and an end
    # past it is the last interval's, unless the thread's intervals overlap.
    starts = [s.start for s in spans]
    for i, start in enumerate(starts):
        if start >= a:
            break
        starts[i] = a
    ends = [s.end for s in spans]
    if ends and ends[-1] > b:
        ends[-1] = b
    if ends and max(ends) > b:
        ends = [min(end, b) for end in ends]
    # An interval still open (its OffCpu comes when it ends, maybe after this gap is
    # attributed): off CPU from its start as far as is known, so that the window's on-CPU
    # time is not spread over time in which the thread slept.
    since = tl.open_off()
    if since and since < b and (not ends or since >= ends[-1]):
        starts.append(max(since, a))
        ends.append(b)
    before = list(accumulate(map(sub, ends, starts), initial=0))
    return OffCpuIndex(a, starts, ends, before, (b - a) - before[-1])


def _clip(span: Span, x: int) -> int:
    return min(max(x, span.start), span.end)


def _span_start(ks: tuple[str, Span]) -> int:
    return ks[1].start


def _cuts(tl: Timeline, spans: list[tuple[str, Span]], a: int, b: int) -> list[int]:
    cuts = {a, b, tl.horizon}
    for kind, sp in spans:
        cuts.add(sp.start)
        cuts.add(sp.end)
        if kind == "offcpu":
            cuts.add(_clip(sp, sp.event.runnable_ns))
    if tl.spans.get("migration"):
        cuts.update(m.start for m in tl.overlapping("migration", a, b))
    return sorted([c for c in cuts if a <= c <= b])


# A segment's spans by kind, every claiming kind present: most segments hold one or two
# kinds, and a copy of this costs less than a new list per kind.
_NONE_ACTIVE: dict[str, tuple[Span, ...]] = dict.fromkeys(CLAIMING_KINDS, ())


def _segment(tl: Timeline, s: int, e: int, active: list[tuple[str, Span]]) -> Segment:
    by_kind = _NONE_ACTIVE.copy()
    for kind, sp in active:
        by_kind[kind] += (sp,)
    off = by_kind["offcpu"][0] if by_kind["offcpu"] else None
    runq = off is not None and s >= _clip(off, off.event.runnable_ns)
    return Segment(s, e, tl, by_kind, off, runq)
