"""GPU idle-gap detection: a deterministic function of the event stream (the daemon replays
traces through the same code, so live and replayed results are identical). Feed events in
stream order; gaps come out once the evidence for them is in.

Evidence, finest first (docs/gpu.md):
- cuda (CudaCall from probes/cuda.py): a launch after a quiet stretch of a process feeding the
  GPU. The stretch began at the process's previous activity: a sync return (the queue had
  drained then: µs placement) or a launch (the GPU may have run queued work for a while
  after it: the start is uncertain). Time blocked in a sync is GPU busy and never part of a
  stretch. With several processes on one GPU, a gap is where all of them were quiet.
- sched (OffCpu from probes/sched.py) inside a traced sync: a sync covers GPU work only while
  work is queued. The driver wakes a thread blocked in a sync when the GPU completes, so the
  wake-up of such a thread marks the queue drained; if the thread then waited on the run
  queue until the sync returned, the GPU idled from that wake-up on: a gap (its cause is the
  run-queue wait, which the engine finds in the same intervals). A thread spinning in a sync
  that was preempted cannot have seen the GPU finish before the preemption began and saw it
  finished when it ran again: the drain lies inside the preemption (if it returned as soon
  as it ran again: a sync that spun on found the GPU still busy). Power against a proven
  floor places it; without one, the thread's own clean syncs do (`baseline`): the drain
  came about as long after the sync's start as it usually does, give or take their spread.
  A thread preempted before it reached its sync, with work queued, finds the queue drained
  and its sync returns at once (the tracer reports such a sync, with the quiet stretch
  before it): the drain came about as long after the stretch's start (the last enqueue) as
  it usually does after the last enqueue before a clean sync.
- power (GpuSample "power", 20 ms on the H200): samples near the GPU's idle floor, once
  that floor is known from evidence: power samples inside a utilisation window that read 0 %,
  or a floor such evidence gave an earlier run (`idle_floors`). Until then power says nothing:
  a GPU busy since the detector started swings and dips within its busy range.
- util (GpuSample "util", 200 ms duty cycle): periods with 0 % busy.

A host-side gap is confirmed or contradicted by the NVML samples inside it; NVML-only gaps
(no host-side stretch covers them, e.g. a process the tracer cannot see) are reported at the
samples' resolution, unless traced syncs cover most of one: a thread blocked in a sync
proves the GPU busy, whatever board power says (power dips under load, as the H200 showed
early in a run), except while that thread waited on the run queue (above). Every gap names
its sources, resolution and confidence.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gpujitter.daemon.analysis.records import GpuGap
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import (
    CudaCall,
    Event,
    GpuProcesses,
    GpuSample,
    OffCpu,
    ProcExit,
    ThreadExit,
)

UNKNOWN_GPU = -1  # a process NVML did not (yet) list on any GPU
K = TypeVar("K")
SWEEP_EVERY_NS = 1_000_000_000  # stream time between looks for exited processes' history


def plausible_idle_w(watts: float) -> bool:
    """Whether `watts` can be a board's idle power: any GPU's lies well inside 1-5000 W. An
    idle floor outside it (a damaged file, a trace header made by hand, NaN) is refused."""
    return 1.0 <= watts <= 5000.0


@dataclass(frozen=True, slots=True)
class GapConfig:
    min_gap_ns: int = 5_000_000  # shorter idle stretches are not reported
    # How long (stream time) a host-side gap waits for NVML samples covering it.
    settle_ns: int = 3_000_000_000
    # A process counts as feeding a GPU if it made a traced CUDA call this recently.
    feeder_window_ns: int = 10_000_000_000
    # Host-side placement: uprobe timestamps are exact; the GPU starts a launch and a sync
    # returns some µs away from the host's view of it.
    cuda_resolution_ns: int = 50_000
    # A power sample counts as idle below this fraction of the way from the GPU's idle floor
    # (its evidenced idle power) to its busy level (the highest power seen): board power
    # follows activity
    # with a lag and smoothing of ~20 ms (docs/gpu.md), so the samples inside a 50 ms gap sit
    # between the two, not at the floor ...
    power_idle_fraction: float = 0.5
    # ... once the GPU has shown a swing at least this large between idle and busy.
    power_min_swing_w: float = 80.0
    power_min_samples: int = 3  # consecutive idle samples for an NVML-only gap
    # Syncs at least this long are kept as proof of a busy GPU against NVML-only gaps
    # (shorter ones cannot cover much of a gap made of 20 ms samples).
    busy_sync_ns: int = 1_000_000
    history_ns: int = 60_000_000_000  # how much NVML and gap history is kept
    # How long (stream time) past a sync's return its verdict waits for the sched probe's
    # off-CPU intervals inside it: they come through another ring buffer, within a poll.
    offcpu_settle_ns: int = 1_000_000_000
    # Off-CPU intervals kept per thread (those with a run-queue wait of at least
    # cuda_resolution_ns): a bound for threads that the sync verdicts never consume.
    max_offcpu_per_thread: int = 4096
    # Only a thread's own syncs read its intervals: those of a thread that made no sync
    # within history_ns are kept this long, and its last offcpu_unsynced_last whatever their
    # age (within the history): a first sync's record comes at its return, after the
    # intervals inside it, and a thread in a sync does nothing else, so the last few are
    # those a sync of any length reads (its wake-up, its last preemption). Kept for the whole
    # history, a watched process of 4000 threads that never sync held ~1.2 million (470 MB).
    # A thread's exit lets its intervals up to it go this long after it: the exit comes
    # through the core's ring, its last sync's record through the cuda ring and its
    # intervals through the sched ring, in any order (beside a job churning threads, ~30 %
    # of those kept were exited threads' last 8, kept for the history).
    offcpu_unsynced_ns: int = 5_000_000_000
    offcpu_unsynced_last: int = 8
    # A thread spinning in a sync sees the drain within this of getting its CPU back (one
    # poll, the return path); a sync that spun on longer found the GPU still busy then.
    spin_return_ns: int = 2_000_000
    # The drain inside a preempted spinning sync, without a proven idle floor: its thread's
    # recent clean syncs (that returned as the GPU drained: no run-queue wait inside, or none
    # within spin_return_ns of the return) say how long after a sync's start the GPU
    # usually drains; at least baseline_min_syncs of the last baseline_syncs (fewer
    # make a spread too narrow to trust: from 12 on the H200, ±0.61 ms stated, 0.96 off).
    baseline_syncs: int = 64
    baseline_min_syncs: int = 16
    # Power corroborates such an estimate when the samples inside it read below this
    # fraction of the power seen during the process's clean syncs (GPU busy): an H200
    # under load dips to ~0.7 of its busy level, idles at ~0.2.
    power_drop_fraction: float = 0.5
    # A sync that spent at most this in its call, off the run queue, did not wait: the
    # queue had drained (the driver's check, the uprobes' own ~2 µs, an interrupt; the
    # stub's first call took 73 µs on the VM). Only such a sync, reached late by a thread
    # that waited on the run queue after its last enqueue, is placed by the "last enqueue
    # to drain" baseline; one that waited longer found the GPU still busy. A GPU that did
    # drain within this of the entry would make such a gap false, but only after running
    # the whole preemption's length beyond the thread's usual work.
    drained_return_ns: int = 200_000

    def __post_init__(self) -> None:
        # A trace header carries these (report replays with them): refuse what the detector
        # cannot work with, e.g. a run of idle samples of length 0, which it indexes.
        for name in ("min_gap_ns", "settle_ns", "feeder_window_ns", "cuda_resolution_ns",
                     "busy_sync_ns", "history_ns", "offcpu_settle_ns", "spin_return_ns",
                     "drained_return_ns", "offcpu_unsynced_ns",
                     "offcpu_unsynced_last"):  # fmt: skip
            if getattr(self, name) < 0:
                raise GpujitterError(f"gaps: {name} must not be negative")
        if self.power_min_samples < 1:
            raise GpujitterError("gaps: power_min_samples must be at least 1")
        if self.max_offcpu_per_thread < 1:
            raise GpujitterError("gaps: max_offcpu_per_thread must be at least 1")
        if not 0 < self.power_idle_fraction < 1:
            raise GpujitterError("gaps: power_idle_fraction must be between 0 and 1")
        if self.power_min_swing_w < 0:
            raise GpujitterError("gaps: power_min_swing_w must not be negative")
        if not 1 <= self.baseline_min_syncs <= self.baseline_syncs:
            raise GpujitterError("gaps: need 1 <= baseline_min_syncs <= baseline_syncs")
        if not 0 < self.power_drop_fraction < 1:
            raise GpujitterError("gaps: power_drop_fraction must be between 0 and 1")


@dataclass(slots=True)
class _Candidate:
    gpu: int
    start: int
    end: int
    tgid: int
    tid_before: int
    tid_after: int
    drained: bool  # the stretch began at a sync return (or a wake-up inside one)
    source: str = "cuda"
    # The stretch holds the run-queue wait of a thread inside a sync (see the module's doc);
    # without a wake-up to mark the drain (a spinning sync), power places its start, or
    # else the thread's clean syncs: (drain, resolution), None when they cannot.
    starved: bool = False
    estimate: tuple[int, int] | None = None
    # Where a host-side stretch began before a starved sync extended it back (its return).
    host_start: int | None = None


@dataclass(slots=True)
class _Quiet:
    start: int
    end: int
    tid_before: int  # the thread active at its start
    tid_after: int  # the thread that ended it


@dataclass(frozen=True, slots=True)
class _Sync:
    tgid: int
    tid: int
    start: int
    end: int
    func: str = ""
    # The process's last enqueue (launch, copy) before the sync's entry, when the stretch
    # from it to the entry was quiet and known (schema 1.7); 0: unknown.
    queued: int = 0

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class _Starved:
    """Where the GPU went idle inside a sync whose thread waited on the run queue."""

    start: int  # the wake-up (drained), the last preemption's start (spinning), the drain
    drained: bool
    # spinning, reached late: (drain, resolution) by the baseline
    estimate: tuple[int, int] | None = None


class _Samples:
    """One GPU's samples of one metric in arrival order, and those lying wholly inside a
    span. A gap is decided seconds after it ends, against a history of a minute (~3,000
    power samples on the H200): while the samples are in time order with no negative
    period, as NVML's rings deliver them, the span's are found by bisection instead of a
    scan of all of them per decision. A stream out of order (a clock step, a hand-made
    trace) is scanned whole until its out-of-order samples age out."""

    __slots__ = ("_descents", "_negative", "items")

    def __init__(self) -> None:
        self.items: deque[GpuSample] = deque()
        self._descents = 0  # neighbours whose later arrival starts earlier
        self._negative = 0  # samples with a negative period

    def append(self, s: GpuSample) -> None:
        if self.items and s.ts_ns < self.items[-1].ts_ns:
            self._descents += 1
        self._negative += s.period_ns < 0
        self.items.append(s)

    def forget_before(self, horizon: int) -> None:
        items = self.items
        while items and items[0].ts_ns < horizon:
            gone = items.popleft()
            self._negative -= gone.period_ns < 0
            if items and items[0].ts_ns < gone.ts_ns:
                self._descents -= 1

    def inside(self, start: int, end: int) -> Iterator[GpuSample]:
        """The samples lying wholly inside [start, end], in arrival order."""
        items = self.items
        if self._descents or self._negative:
            yield from (s for s in items if s.ts_ns >= start and s.ts_ns + s.period_ns <= end)
            return
        # A deque's item is found from its nearer end: the span is near the newest.
        for k in range(bisect_left(items, start, key=_ts_ns), len(items)):
            s = items[k]
            if s.ts_ns > end:
                return
            if s.ts_ns + s.period_ns <= end:
                yield s

    def __iter__(self) -> Iterator[GpuSample]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> GpuSample:
        return self.items[k]


def _ts_ns(s: GpuSample) -> int:
    return s.ts_ns


@dataclass(slots=True)
class _GpuState:
    pids: tuple[int, ...] = ()
    power: _Samples = field(default_factory=_Samples)
    util: _Samples = field(default_factory=_Samples)
    idle_floor: float | None = None  # lowest power proven idle (a 0 % utilisation window)
    power_peak: float | None = None
    idle_windows: deque[GpuSample] = field(default_factory=deque)  # utilisation at 0 %
    power_run: list[GpuSample] = field(default_factory=list)  # current run of idle samples
    util_run: list[GpuSample] = field(default_factory=list)
    nvml_only: list[_Candidate] = field(default_factory=list)
    # Gaps emitted in the history, oldest first, each with its reach: the latest end of it
    # and of every gap emitted before it (_overlaps_emitted stops at the first too early).
    emitted: deque[tuple[GpuGap, int]] = field(default_factory=deque)
    emitted_end: int = 0  # the latest end of those, ever

    def power_past(self, end: int) -> bool:
        """Whether a power sample has come a whole period past `end`: what the GPU did up to
        it is known."""
        power = self.power.items
        return bool(power) and power[-1].ts_ns >= end


class _OffCpuKept:
    """A thread's kept off-CPU intervals: in arrival order (the oldest arrival is dropped
    first, past the bound or the history) and in time order, (ts_ns, end_ns), so that a
    sync finds those inside it by bisection instead of a scan of all of them per sync."""

    __slots__ = ("arrived", "by_time", "keys", "maxlen")

    def __init__(self, maxlen: int) -> None:
        self.arrived: deque[OffCpu] = deque()
        self.keys: list[tuple[int, int]] = []
        self.by_time: list[OffCpu] = []
        self.maxlen = maxlen

    def add(self, o: OffCpu) -> None:
        if len(self.arrived) >= self.maxlen:
            self._forget(self.arrived.popleft())
        self.arrived.append(o)
        key = (o.ts_ns, o.end_ns)
        if not self.keys or key >= self.keys[-1]:  # the usual case: in time order
            self.keys.append(key)
            self.by_time.append(o)
            return
        at = bisect_right(self.keys, key)  # after equal keys: arrival order among them
        self.keys.insert(at, key)
        self.by_time.insert(at, o)

    def forget_before(self, horizon: int, keep: int = 0) -> None:
        """Drop the oldest arrivals while they ended before the horizon, down to the last
        `keep` of them."""
        while len(self.arrived) > keep and self.arrived[0].end_ns < horizon:
            self._forget(self.arrived.popleft())

    def _forget(self, o: OffCpu) -> None:
        at = bisect_left(self.keys, (o.ts_ns, o.end_ns))
        while self.by_time[at] is not o:
            at += 1
        del self.keys[at], self.by_time[at]

    def __len__(self) -> int:
        return len(self.arrived)

    def inside(self, start: int, end: int) -> list[OffCpu]:
        """The intervals lying inside [start, end], in time order."""
        found = []
        for at in range(bisect_left(self.keys, (start,)), len(self.keys)):
            o = self.by_time[at]
            if o.ts_ns > end:
                break
            if o.ts_ns <= o.end_ns <= end:
                found.append(o)
        return found

    def since(self, start: int) -> Iterator[OffCpu]:
        """The intervals that began at or after `start`."""
        for at in range(bisect_left(self.keys, (start,)), len(self.keys)):
            yield self.by_time[at]


def _drop_stale(table: dict[K, deque[_Sync]], horizon: int) -> None:
    """Entries whose latest sync ended before the horizon (threads, processes gone quiet)."""
    for key in [k for k, kept in table.items() if kept[-1].end < horizon]:
        del table[key]


class GapDetector:
    """idle_floors: GPU index -> idle power (W) that evidence gave an earlier run of this
    GPU's board (the daemon's state directory; the trace header carries it to replays)."""

    def __init__(
        self, config: GapConfig | None = None, idle_floors: Mapping[int, float] | None = None
    ) -> None:
        self.config = config or GapConfig()
        self.now_ns = 0
        self.gpus: dict[int, _GpuState] = {}
        for index, watts in (idle_floors or {}).items():
            self.gpu(index).idle_floor = watts
        self.pending: list[_Candidate] = []
        # GPU -> the earliest end among its pending candidates (_next_due), and among those
        # no sync holds back (_settled) as the last look at each found them: the first to
        # settle (_settling), so that most evidence needs no look at every one waiting. That
        # look is stale once a candidate is proposed or a sync judged (it may free some).
        self._first_end: dict[int, int] = {}
        self._open_first: dict[int, int] = {}
        self._open_stale = False
        self.last_call: dict[int, int] = {}  # tgid -> end of its latest traced call
        self.quiet: dict[int, deque[_Quiet]] = {}  # tgid -> recent quiet stretches
        self.busy: dict[int, deque[_Sync]] = {}  # tgid -> recent long syncs
        self.syncs: deque[_Sync] = deque()  # syncs waiting for their off-CPU intervals
        # Where those end, by (tgid, end): a candidate beginning at one waits (_settled),
        # asked for every pending candidate at each decision.
        self._sync_ends: Counter[tuple[int, int]] = Counter()
        # The stream time at which _finalise next decides something: a candidate's or
        # NVML-only candidate's settling, a sync's verdict (_finalise sets it); evidence
        # that may let a candidate settle sooner (a candidate proposed, a GPU's sample or
        # process list) makes it due at once. Between those, _finalise would decide nothing
        # however many candidates wait.
        self._due_ns = 0
        self.offcpu: dict[int, _OffCpuKept] = {}  # tid -> intervals with a run-queue wait
        self.syncing: dict[int, int] = {}  # tid -> end of its latest sync
        # (when, tid) of threads' exits, in arrival order: every exit, since a thread's
        # intervals may come after its exit (the sched ring read later than the core's)
        self.exits: deque[tuple[int, int]] = deque()
        # Syncs with no run-queue wait inside, by (tid, func) and (tid, ""), and by tgid.
        self.clean: dict[tuple[int, str], deque[_Sync]] = {}
        self.clean_spans: dict[int, deque[_Sync]] = {}
        # Clean syncs that waited, with the last enqueue before them, by thread: how long
        # after its last enqueue the GPU drains.
        self.clean_queued: dict[int, deque[_Sync]] = {}
        # Every sync that waited, clean or not, keyed as those: each returned after its
        # drain, so its length bounds the drain from above (the baselines' fallback).
        self.waited: dict[tuple[int, str], deque[_Sync]] = {}
        self.waited_queued: dict[int, deque[_Sync]] = {}
        self._swept_ns = 0
        # GPUs with NVML-only candidates waiting: most events find none, and _finalise
        # returns at once when nothing else waits either.
        self._nvml_waiting: set[int] = set()
        # What each kind of evidence changes (a table by type, not a chain of isinstance
        # tests: every event of the stream passes here).
        self._handlers: dict[type, Callable[[Any], None]] = {
            CudaCall: self._on_cuda,
            GpuSample: self._on_sample,
            GpuProcesses: self._on_procs,
            OffCpu: self._on_offcpu,
            ThreadExit: lambda ev: self.exits.append((ev.ts_ns, ev.tid)),
            ProcExit: lambda ev: self.exits.append((ev.ts_ns, ev.tgid)),  # mostly the last
        }

    def gpu(self, index: int) -> _GpuState:
        if index not in self.gpus:
            self.gpus[index] = _GpuState()
        return self.gpus[index]

    def _nvml_seen(self) -> bool:
        """Whether NVML told of a GPU (a sample, a process list, a recorded idle floor). Not
        `self.gpus` alone: deciding a gap of a process no GPU lists keeps a state under
        UNKNOWN_GPU, which made a node without NVML look like one with it from its first
        gap on and held each later candidate the whole settle_ns."""
        return len(self.gpus) > (UNKNOWN_GPU in self.gpus)

    def idle_floors(self) -> dict[int, float]:
        """GPU index -> its evidenced idle power (W), for the GPUs where one is known."""
        return {
            i: st.idle_floor for i, st in sorted(self.gpus.items()) if st.idle_floor is not None
        }

    def gpus_of(self, tgid: int) -> list[int]:
        found = [g for g, st in sorted(self.gpus.items()) if tgid in st.pids]
        return found or [UNKNOWN_GPU]

    # ---- input -------------------------------------------------------------------------

    def feed(self, ev: Event) -> list[GpuGap]:
        self.now_ns = max(self.now_ns, ev.ts_ns + getattr(ev, "dur_ns", 0))
        if self.now_ns - self._swept_ns >= SWEEP_EVERY_NS:
            self._sweep()
        handler = self._handlers.get(type(ev))
        if handler is not None:
            handler(ev)
        if self.now_ns >= self._due_ns:
            return self._finalise(force=False)
        return []  # the usual event: nothing is due

    def flush(self) -> list[GpuGap]:
        """End of the stream: decide every pending gap with the evidence there is."""
        return self._finalise(force=True)

    def _on_cuda(self, ev: CudaCall) -> None:
        self.last_call[ev.tgid] = max(self.last_call.get(ev.tgid, 0), ev.ts_ns + ev.dur_ns)
        if ev.api == "sync":
            self.syncing[ev.tid] = ev.ts_ns + ev.dur_ns
            queued = ev.after_idle_ns > 0 and ev.prev_api not in ("", "sync")
            sync = _Sync(ev.tgid, ev.tid, ev.ts_ns, ev.ts_ns + ev.dur_ns, ev.func,
                         ev.ts_ns - ev.after_idle_ns if queued else 0)  # fmt: skip
            if ev.dur_ns >= self.config.busy_sync_ns:
                self._remember_busy(sync)
            late = queued and sync.end - sync.queued >= self.config.min_gap_ns
            if ev.dur_ns >= self.config.cuda_resolution_ns or late:
                self.syncs.append(sync)
                self._sync_ends[sync.tgid, sync.end] += 1
            return
        if ev.after_idle_ns <= 0:
            return
        start = ev.ts_ns - ev.after_idle_ns
        stretches = self.quiet.setdefault(ev.tgid, deque())
        stretches.append(_Quiet(start, ev.ts_ns, ev.prev_tid, ev.tid))
        while stretches and stretches[0].end < self.now_ns - self.config.history_ns:
            stretches.popleft()
        if ev.after_idle_ns < self.config.min_gap_ns:
            return
        self._propose(
            _Candidate(UNKNOWN_GPU, start, ev.ts_ns, ev.tgid, ev.prev_tid, ev.tid,
                       drained=ev.prev_api == "sync")
        )  # fmt: skip

    def _propose(self, c: _Candidate) -> None:
        """A candidate gap for each GPU its process feeds."""
        first = self._first_end
        for g in self.gpus_of(c.tgid):
            self.pending.append(replace(c, gpu=g))
            first[g] = min(first.get(g, c.end), c.end)
        self._open_stale = True
        self._due_ns = 0

    def _on_procs(self, ev: GpuProcesses) -> None:
        self.gpu(ev.gpu).pids = ev.pids
        self._due_ns = 0

    def _on_offcpu(self, ev: OffCpu) -> None:
        if ev.runq_ns < self.config.cuda_resolution_ns:
            return  # no run-queue wait worth keeping: no sync's verdict can use it
        kept = self.offcpu.get(ev.tid)
        if kept is None:
            kept = self.offcpu[ev.tid] = _OffCpuKept(self.config.max_offcpu_per_thread)
        kept.add(ev)
        self._forget_offcpu(ev.tid, kept)

    def _forget_offcpu(self, tid: int, kept: _OffCpuKept) -> None:
        """A thread's intervals past the history; a thread's that made no sync in it, past
        offcpu_unsynced_ns but for its last offcpu_unsynced_last."""
        cfg = self.config
        kept.forget_before(self.now_ns - cfg.history_ns)
        if tid not in self.syncing:
            kept.forget_before(self.now_ns - cfg.offcpu_unsynced_ns, cfg.offcpu_unsynced_last)

    def _sweep(self) -> None:
        """Forget processes and threads gone quiet (exited, mostly): each one's history is
        pruned only when it adds to it, so without this an exited process would keep its
        last history_ns of syncs and quiet stretches for good (one per restart of a job)."""
        self._swept_ns = self.now_ns
        horizon = self.now_ns - self.config.history_ns
        for tgid in [t for t, end in self.last_call.items() if end < horizon]:
            del self.last_call[tgid]
        for table in (self.quiet, self.busy):
            for tgid in [t for t, kept in table.items() if not kept or kept[-1].end < horizon]:
                del table[tgid]
        _drop_stale(self.clean, horizon)  # the spinning syncs' baselines
        _drop_stale(self.clean_spans, horizon)
        _drop_stale(self.clean_queued, horizon)
        _drop_stale(self.waited, horizon)
        _drop_stale(self.waited_queued, horizon)
        for tid in [t for t, end in self.syncing.items() if end < horizon]:
            del self.syncing[tid]
        # Exited threads' intervals up to their exit, whole: a reused tid's are later ones.
        exits, gone = self.exits, self.now_ns - self.config.offcpu_unsynced_ns
        while exits and exits[0][0] < gone:
            exit_ns, tid = exits.popleft()
            kept = self.offcpu.get(tid)
            if kept is not None:
                kept.forget_before(exit_ns + 1)
        # a thread's intervals may all have gone already (a history shorter than their wait)
        for tid, kept in list(self.offcpu.items()):
            self._forget_offcpu(tid, kept)
            if not kept:
                del self.offcpu[tid]

    def _remember_busy(self, sync: _Sync) -> None:
        spans = self.busy.setdefault(sync.tgid, deque())
        spans.append(sync)
        while spans and spans[0].end < self.now_ns - self.config.history_ns:
            spans.popleft()

    def _runq_inside(self, sync: _Sync) -> list[OffCpu]:
        """The thread's off-CPU intervals with a run-queue wait that lie inside the sync, in
        time order (uprobes and the sched tracepoints read one clock: the sync's entry comes
        before the switch out, the switch back in before its return)."""
        kept = self.offcpu.get(sync.tid)
        return kept.inside(sync.start, sync.end) if kept is not None else []

    def _busy_ns(self, index: int, st: _GpuState, start: int, end: int) -> int:
        """How much of [start, end] a process of GPU `index` (or of no known GPU) spent
        blocked in a sync: the GPU was running its work then. A sync's run-queue waits prove
        nothing: a woken thread saw the GPU finish already, a preempted spinning one could
        not see it finish."""
        spans = sorted(
            (max(a, start), min(b, end))
            for tgid, found in self.busy.items()
            if tgid in st.pids or self.gpus_of(tgid) == [UNKNOWN_GPU]
            for sync in found
            if sync.start < end and start < sync.end
            for a, b in self._waiting_parts(sync)
            if a < end and start < b
        )
        covered, reach = 0, start
        for a, b in spans:
            covered += max(0, b - max(a, reach))
            reach = max(reach, b)
        return covered

    def _waiting_parts(self, sync: _Sync) -> list[tuple[int, int]]:
        """The sync's span less its thread's run-queue waits."""
        parts, at = [], sync.start
        for o in self._runq_inside(sync):
            if o.runnable_ns > at:
                parts.append((at, o.runnable_ns))
            at = max(at, o.end_ns)
        if at < sync.end:
            parts.append((at, sync.end))
        return parts

    def _starved_from(self, sync: _Sync, inside: list[OffCpu]) -> _Starved | None:
        """Where the GPU went idle before this sync returned, because its thread waited on
        the run queue (`inside`: its run-queue waits in the sync). Blocked and woken: from
        the wake-up (the GPU's completion), when the thread was runnable for most of the
        stretch up to the return (else it ran: a wake-up before the last one was not the
        completion). Spinning: inside the last preemption, when the sync returned as soon as
        the thread ran again (after any earlier one it ran and polled, the GPU busy; one that
        spun on found it busy still)."""
        woken = [o for o in inside if o.state != "preempted"]
        if woken:
            start = woken[-1].runnable_ns
            # from the wake-up on: its run-queue wait and any preemption after it
            runnable = sum(o.end_ns - max(o.runnable_ns, start) for o in inside if o.end_ns > start)
            return _Starved(start, drained=True) if 2 * runnable >= sync.end - start else None
        last = inside[-1]
        if sync.end - last.end_ns > self.config.spin_return_ns:
            return None
        return _Starved(last.ts_ns, drained=False, estimate=self._baseline_drain(sync, last))

    def _typical(self, lengths: Iterable[int]) -> tuple[int, int]:
        """The median of a baseline's lengths and their spread: the larger distance from the
        median to the 10th or 90th percentile, at least the host side's resolution."""
        ranked = sorted(lengths)
        n = len(ranked)
        low, typical, high = ranked[n // 10], ranked[n // 2], ranked[(9 * n) // 10]
        return typical, max(high - typical, typical - low, self.config.cuda_resolution_ns)

    def _usual(
        self,
        clean: list[Iterable[_Sync]],
        waited: list[Iterable[_Sync]],
        length: Callable[[_Sync], int],
    ) -> tuple[int, int] | None:
        """How long the GPU usually takes to drain (`length` of a sync: from its start, or
        from its last enqueue) and the spread: from the first of the clean baselines that
        holds baseline_min_syncs (their median, _typical); else, where outside load left
        too few clean (a busy task sharing the CPU preempts the thread across most drains),
        from the syncs that waited, each of which returned after its drain: the 10th
        percentile of their lengths, which lies after the drain of 9 in 10 syncs of the
        same work (idle understated rather than invented), its spread up to their 25th
        percentile. None with too few of either."""
        enough = self.config.baseline_min_syncs
        for kept in clean:
            lengths = [length(c) for c in kept]
            if len(lengths) >= enough:
                return self._typical(lengths)
        for kept in waited:
            ranked = sorted(length(c) for c in kept)
            n = len(ranked)
            if n >= enough:
                bound = ranked[n // 10]
                return bound, max(ranked[n // 4] - bound, self.config.cuda_resolution_ns)
        return None

    def _baseline_drain(self, sync: _Sync, last: OffCpu) -> tuple[int, int] | None:
        """The drain inside preemption `last` of a spinning sync, by the thread's clean
        syncs: as long after the sync's start as their median, within the preemption, give
        or take their spread. None with too few of them, or when the thread still polled a
        busy GPU (the preemption's start) past what they span: this sync's work was not the
        usual."""
        keys = ((sync.tid, sync.func), (sync.tid, ""))
        found = self._usual(
            [self.clean.get(k, ()) for k in keys], [self.waited.get(k, ()) for k in keys],
            lambda c: c.end - c.start,
        )  # fmt: skip
        if found is None:
            return None
        typical, spread = found
        if last.ts_ns - sync.start > typical + spread:
            return None
        return min(max(last.ts_ns, sync.start + typical), last.end_ns), spread

    def _reached_late(self, sync: _Sync, inside: list[OffCpu]) -> _Starved | None:
        """A sync that returned at once (the queue had drained) after a quiet stretch that
        began at an enqueue, in which its thread waited on the run queue: the GPU drained
        about as long after that enqueue as it does before the thread's clean syncs, give or
        take their spread, and idled from there while the thread waited. None when the
        sync waited (the GPU still busy at its entry), with too few clean syncs, when they
        place the drain at or after the entry, or when the thread was runnable for less than
        half of the drain to the return (it ran: its own host work, not a starved sync). A
        run-queue wait inside the sync is no wait for the GPU."""
        cfg = self.config
        if not sync.queued:
            return None
        waited = sum(b - a for a, b in self._waiting_parts(sync)) if inside else sync.dur
        if waited > cfg.drained_return_ns:
            return None
        found = self._usual(
            [self.clean_queued.get(sync.tid, ())], [self.waited_queued.get(sync.tid, ())],
            lambda c: c.end - c.queued,
        )  # fmt: skip
        if found is None:
            return None
        typical, spread = found
        drain = sync.queued + typical
        if drain >= sync.start:
            return None
        kept = self.offcpu.get(sync.tid)
        runnable = sum(
            min(o.end_ns, sync.end) - max(o.runnable_ns, drain)
            for o in (kept.since(sync.queued) if kept is not None else ())
            if o.end_ns > drain and o.runnable_ns < sync.end
        )
        if 2 * runnable < sync.end - drain:
            return None
        return _Starved(drain, drained=False, estimate=(drain, spread))

    def _saw_drain(self, sync: _Sync, inside: list[OffCpu]) -> bool:
        """Whether the sync returned as the GPU drained: its thread never waited on the run
        queue in it, or was last preempted more than spin_return_ns before the return and
        spun (or slept) on, so it saw the drain as it came (the rule that places a drain
        inside a preemption, turned round). On a CPU shared with a busy task outside the
        job nearly every sync holds such a preemption (issue 11: a one-CPU hog left none
        with no run-queue wait); one preempted across its drain returns when the thread
        runs again, late, and a wake-up inside marks a drain of its own: neither is kept."""
        if not inside:
            return True
        spun_on = sync.end - inside[-1].end_ns > self.config.spin_return_ns
        return spun_on and all(o.state == "preempted" for o in inside)

    def _remember_waited(self, sync: _Sync, clean: bool) -> None:
        """A sync that waited (a shorter one may have found the queue drained): how long,
        at most, the GPU took to drain after it was called, for this function and for the
        thread, and after the last enqueue; exactly, when it was clean (it returned as
        the GPU drained: _saw_drain)."""
        if sync.dur < self.config.busy_sync_ns:
            return
        keep = self.config.baseline_syncs
        for key in ((sync.tid, sync.func), (sync.tid, "")):
            self.waited.setdefault(key, deque(maxlen=keep)).append(sync)
        if sync.queued:
            self.waited_queued.setdefault(sync.tid, deque(maxlen=keep)).append(sync)
        if not clean:
            return
        for key in ((sync.tid, sync.func), (sync.tid, "")):
            self.clean.setdefault(key, deque(maxlen=keep)).append(sync)
        self.clean_spans.setdefault(sync.tgid, deque(maxlen=keep)).append(sync)
        if sync.queued:
            self.clean_queued.setdefault(sync.tid, deque(maxlen=keep)).append(sync)

    def _on_sample(self, ev: GpuSample) -> None:
        self._due_ns = 0  # a power sample may settle a candidate; any may add NVML-only ones
        st = self.gpu(ev.gpu)
        cfg = self.config
        if ev.metric == "power":
            st.power.append(ev)
            st.power_peak = ev.value if st.power_peak is None else max(st.power_peak, ev.value)
            self._learn_floor(st, [ev], st.idle_windows)
            idle = self._power_idle(st, ev)
            self._extend_run(st, st.power_run, ev, idle, cfg.power_min_samples)
        else:
            st.util.append(ev)
            if ev.value <= 0.0:
                st.idle_windows.append(ev)
                self._learn_floor(st, st.power.inside(ev.ts_ns, ev.ts_ns + ev.period_ns), [ev])
            self._extend_run(st, st.util_run, ev, ev.value <= 0.0, 1)
        horizon = self.now_ns - cfg.history_ns
        st.power.forget_before(horizon)
        st.util.forget_before(horizon)
        # The power samples of a window arrive within a poll or two of it (500 ms each).
        while st.idle_windows and st.idle_windows[0].ts_ns < self.now_ns - cfg.settle_ns:
            st.idle_windows.popleft()

    @staticmethod
    def _learn_floor(
        st: _GpuState, power: Iterable[GpuSample], windows: Iterable[GpuSample]
    ) -> None:
        """Power samples lying wholly inside a utilisation window that read 0 % were taken
        while the GPU ran nothing: the lowest of them is its idle floor. Either may arrive
        first (the sampler reads utilisation, then power, each up to the time of reading)."""
        proven = [
            s.value
            for w in windows
            for s in power
            if w.ts_ns <= s.ts_ns and s.ts_ns + s.period_ns <= w.ts_ns + w.period_ns
        ]
        if st.idle_floor is not None:
            proven.append(st.idle_floor)
        if proven:
            st.idle_floor = min(proven)

    def _power_idle(self, st: _GpuState, s: GpuSample) -> bool | None:
        """Idle, busy, or None while the GPU has not shown how far apart those are: its idle
        floor proven, and a busy level well above it. The lowest power seen is no floor: a
        GPU busy since the start dips within its busy range (the H200 from ~720 W to ~490 W)."""
        if st.idle_floor is None or st.power_peak is None:
            return None
        swing = st.power_peak - st.idle_floor
        if swing < self.config.power_min_swing_w:
            return None
        return s.value < st.idle_floor + self.config.power_idle_fraction * swing

    def _extend_run(
        self,
        st: _GpuState,
        run: list[GpuSample],
        s: GpuSample,
        idle: bool | None,
        min_samples: int,
    ) -> None:
        """Runs of idle samples bounded by busy ones on both sides become NVML-only
        candidates (a GPU idle from the start or to the end is not a gap in feeding)."""
        if idle is None:
            run.clear()
            return
        if idle:
            if run or self._was_busy(st, s):
                run.append(s)
            return
        if len(run) >= min_samples and st.pids:
            start, end = run[0].ts_ns, run[-1].ts_ns + run[-1].period_ns
            if end - start >= self.config.min_gap_ns:
                st.nvml_only.append(
                    _Candidate(
                        gpu=s.gpu,
                        start=start,
                        end=end,
                        tgid=0,
                        tid_before=0,
                        tid_after=0,
                        drained=False,
                        source=s.metric,
                    )
                )
                self._nvml_waiting.add(s.gpu)
        run.clear()

    def _was_busy(self, st: _GpuState, s: GpuSample) -> bool:
        """Whether the sample before `s` in its stream was busy (a run starts at an edge)."""
        samples = st.power if s.metric == "power" else st.util
        if len(samples) < 2:
            return False
        before = samples[-2]
        if s.metric == "power":
            return self._power_idle(st, before) is False
        return before.value > 0.0

    # ---- decisions ---------------------------------------------------------------------

    def _judge_syncs(self, force: bool) -> None:
        """Syncs whose off-CPU intervals are in: a run-queue wait that starved the GPU
        extends the host-side candidate that begins at the sync's return (the stretch after
        it, when the thread was slow to launch again), or becomes a candidate of its own."""
        settle = self.config.offcpu_settle_ns
        while self.syncs and (force or self.now_ns >= self.syncs[0].end + settle):
            sync = self.syncs.popleft()
            self._open_stale = True
            ends = self._sync_ends
            ends[sync.tgid, sync.end] -= 1
            if not ends[sync.tgid, sync.end]:
                del ends[sync.tgid, sync.end]
            inside = self._runq_inside(sync)
            found = self._reached_late(sync, inside)
            if found is None and inside:
                found = self._starved_from(sync, inside)
            self._remember_waited(sync, self._saw_drain(sync, inside))
            if found is None:
                continue
            start, drained = found.start, found.drained
            after = [c for c in self.pending if c.tgid == sync.tgid and c.start == sync.end]
            for c in after:
                c.host_start = c.start
                c.start, c.drained, c.starved, c.estimate = start, drained, True, found.estimate
            if after or sync.end - start < self.config.min_gap_ns:
                continue
            self._propose(
                _Candidate(UNKNOWN_GPU, start, sync.end, sync.tgid, sync.tid, sync.tid,
                           drained=drained, starved=True, estimate=found.estimate)
            )  # fmt: skip

    def _finalise(self, force: bool) -> list[GpuGap]:
        out: list[GpuGap] = []
        keep: list[_Candidate] = []
        self._judge_syncs(force)
        ready = set() if force else self._settling()
        if force or ready:
            held = self._sync_ends
            open_first: dict[int, int] = {}
            for c in self.pending:
                if not force and (c.gpu not in ready or not self._settled(c)):
                    keep.append(c)
                    if (c.tgid, c.start) not in held:
                        open_first[c.gpu] = min(open_first.get(c.gpu, c.end), c.end)
                    continue
                # A process NVML had not listed yet when its gap arrived may be listed now.
                gpus = self.gpus_of(c.tgid) if c.gpu == UNKNOWN_GPU else [c.gpu]
                for g in gpus:
                    out += self._remember(self._decide_host(replace(c, gpu=g)))
            self._open_first, self._open_stale = open_first, False
            if len(keep) < len(self.pending):  # most passes decide nothing (syncs unjudged)
                self.pending = keep
                first = self._first_end = {}
                for c in keep:
                    first[c.gpu] = min(first.get(c.gpu, c.end), c.end)
        starts: dict[int, int] | None = None  # GPU -> earliest start pending, once a pass
        for index in sorted(self._nvml_waiting):
            st = self.gpus[index]
            waiting: list[_Candidate] = []
            for c in sorted(st.nvml_only, key=lambda c: (c.start, c.source)):
                if force or self.now_ns >= c.end + self.config.settle_ns:
                    if starts is None:
                        starts = {}
                        for p in self.pending:
                            starts[p.gpu] = min(starts.get(p.gpu, p.start), p.start)
                    decided = self._decide_nvml_only(index, st, c, starts.get(index))
                    out += self._remember(decided)
                else:
                    waiting.append(c)
            st.nvml_only = waiting
            if not waiting:
                self._nvml_waiting.discard(index)
        if len(out) > 1:
            out.sort(key=lambda g: (g.ts_ns, g.gpu))
        self._due_ns = self._next_due()
        return out

    def _next_due(self) -> int:
        """When time alone next changes what _finalise decides: the first pending or
        NVML-only candidate to settle, the first sync's verdict. Everything else that can
        change it (power samples, processes listed, candidates proposed) is evidence."""
        settle = self.config.settle_ns
        due = [end + settle for end in self._first_end.values()]
        due += [c.end + settle for i in self._nvml_waiting for c in self.gpus[i].nvml_only]
        if self.syncs:
            due.append(self.syncs[0].end + self.config.offcpu_settle_ns)
        return min(due, default=1 << 62)

    def _remember(self, gaps: list[GpuGap]) -> list[GpuGap]:
        for gap in gaps:
            st = self.gpu(gap.gpu)
            emitted = st.emitted
            st.emitted_end = max(st.emitted_end, gap.end_ns)
            emitted.append((gap, st.emitted_end))
            while emitted and emitted[0][0].end_ns < self.now_ns - self.config.history_ns:
                emitted.popleft()
        return gaps

    def _settling(self) -> set[int]:
        """The GPUs some of whose pending candidates may settle now. Of a GPU's candidates no
        sync holds back, the earliest-ending settles first: the time and the power sample a
        candidate waits for both come later for a later end. A held one waits for its sync's
        verdict, which marks the look stale; so does a new candidate, and then every GPU
        with one pending is looked at. A GPU here says only that a look at each of its
        candidates is worth it (a sync reported since may hold one back)."""
        if self._open_stale:
            return set(self._first_end)
        settle = self.config.settle_ns
        found = set()
        for g, end in self._open_first.items():
            if self.now_ns >= end + settle:
                found.add(g)
            elif g == UNKNOWN_GPU:
                if not self._nvml_seen():
                    found.add(g)
            elif (st := self.gpus.get(g)) is not None and st.power_past(end):
                found.add(g)
        return found

    def _settled(self, c: _Candidate) -> bool:
        if (c.tgid, c.start) in self._sync_ends:
            return False  # the sync it begins at may hold a starved stretch to prepend
        if self.now_ns >= c.end + self.config.settle_ns:
            return True
        if c.gpu == UNKNOWN_GPU:
            return not self._nvml_seen()  # no NVML on this node: nothing more will come
        st = self.gpus.get(c.gpu)
        return st is not None and st.power_past(c.end)

    def _feeders(self, c: _Candidate) -> list[int]:
        """Processes feeding c's GPU around c: listed on it (or c's own) and recently active."""
        listed = set(self.gpu(c.gpu).pids) if c.gpu != UNKNOWN_GPU else set()
        listed.add(c.tgid)
        window = self.config.feeder_window_ns
        return sorted(
            t for t in listed if t == c.tgid or self.last_call.get(t, 0) >= c.start - window
        )

    def _all_quiet(self, c: _Candidate, feeders: list[int]) -> list[_Quiet]:
        """The parts of c where every other feeder was inside a known quiet stretch, each
        with the threads active at its edges (whichever stretch bounds it there)."""
        parts = [_Quiet(c.start, c.end, c.tid_before, c.tid_after)]
        for tgid in feeders:
            if tgid == c.tgid:
                continue
            parts = [
                _Quiet(
                    max(p.start, q.start),
                    min(p.end, q.end),
                    q.tid_before if q.start > p.start else p.tid_before,
                    q.tid_after if q.end < p.end else p.tid_after,
                )
                for p in parts
                for q in self.quiet.get(tgid, ())
                if max(p.start, q.start) < min(p.end, q.end)
            ]
        return [p for p in parts if p.end - p.start >= self.config.min_gap_ns]

    def _decide_host(self, c: _Candidate) -> list[GpuGap]:
        cfg = self.config
        st = self.gpu(c.gpu)
        feeders = self._feeders(c)
        gaps = []
        for part in self._all_quiet(c, feeders):
            start, end = part.start, part.end
            drained, starved = c.drained, c.starved
            verdict = self._power_verdict(st, start, end)
            if starved and not drained and verdict != "idle" and c.estimate is None:
                # A spinning sync's drain that nothing places (no idle power, no baseline):
                # not even the whole preemption is claimed (the GPU ran some of it, maybe
                # all but the last µs). Only a stretch after the sync's return stands.
                if c.host_start is None or end - c.host_start < cfg.min_gap_ns:
                    continue
                start, drained, starved = max(start, c.host_start), True, False
                verdict = self._power_verdict(st, start, end)
            if self._overlaps_emitted(st, start, end):
                continue
            sources = ["cuda", "sched"] if starved else ["cuda"]
            resolution = cfg.cuda_resolution_ns
            if verdict == "idle":
                sources.append("power")
                confidence = 0.97 if drained else 0.8
                if starved and not drained:  # the drain lies inside a preemption
                    start, resolution = self._power_drain(st, start, end)
            elif c.estimate is not None and verdict is None:
                # No proven floor (or too short for power to tell): the thread's clean syncs
                # place the drain; power well below their level corroborates it.
                start, resolution = max(start, c.estimate[0]), c.estimate[1]
                if end - start < cfg.min_gap_ns:
                    continue
                sources.append("baseline")
                confidence = 0.6
                if self._power_dropped(st, c.tgid, start, end):
                    sources.append("power")
                    confidence = 0.7
            elif drained:
                # The queue had drained at the start; power busy all along means a process
                # the tracer does not see fed the GPU.
                confidence = 0.4 if verdict == "busy" else 0.9
            elif st.power or (c.gpu != UNKNOWN_GPU and self._has_nvml(c.gpu)):
                # No sync showed the queue drained, and power does not show idle: the host was
                # quiet, but queued work may have kept the GPU busy. Not a gap we can claim.
                continue
            else:
                confidence = 0.3  # no NVML evidence at all: host-side quiet only
            if self._util_idle_inside(st, start, end):
                sources.append("util")
                confidence = min(0.99, confidence + 0.02)
            if len(feeders) > 1:
                confidence = min(confidence, 0.8)
            gaps.append(
                GpuGap(
                    ts_ns=start,
                    end_ns=end,
                    gpu=c.gpu,
                    sources=tuple(sources),
                    resolution_ns=resolution,
                    confidence=confidence,
                    tgids=tuple(feeders),
                    tid_before=part.tid_before,
                    tid_after=part.tid_after,
                )
            )
        return gaps

    def _power_verdict(self, st: _GpuState, start: int, end: int) -> str | None:
        """ "idle" if most power samples lying wholly inside [start, end] are idle, "busy" if
        none of at least two is, else None (too short for 20 ms samples, or no swing yet)."""
        verdicts = [self._power_idle(st, s) for s in st.power.inside(start, end)]
        known = [v for v in verdicts if v is not None]
        if not known:
            return None
        idle = sum(known)
        if idle * 2 >= len(known):
            return "idle"
        if idle == 0 and len(known) >= 2:
            return "busy"
        return None

    def _power_drain(self, st: _GpuState, start: int, end: int) -> tuple[int, int]:
        """Where the GPU went idle within [start, end], by power: the start of the first idle
        sample lying inside (no earlier than `start`), and that placement's resolution."""
        for s in st.power.inside(start, end):
            if self._power_idle(st, s):
                return s.ts_ns, s.period_ns
        return start, self.config.cuda_resolution_ns

    def _power_dropped(self, st: _GpuState, tgid: int, start: int, end: int) -> bool:
        """Most power samples lying wholly inside [start, end] read below power_drop_fraction
        of the median sample taken during the process's clean syncs (the GPU busy then)."""

        # A sample lies inside some clean sync when, of the syncs that began by its start,
        # the one reaching furthest ends at or after its end: by bisection over the syncs
        # in order of their starts, not a scan of every sync for every sample.
        spans = sorted((c.start, c.end) for c in self.clean_spans.get(tgid, ()))
        starts = [a for a, _ in spans]
        reach = list(itertools.accumulate((b for _, b in spans), max))
        busy = sorted(
            s.value
            for s in st.power
            if (k := bisect_right(starts, s.ts_ns)) and reach[k - 1] >= s.ts_ns + s.period_ns
        )
        inside = [s.value for s in st.power.inside(start, end)]
        if not busy or not inside:
            return False
        level = busy[len(busy) // 2] * self.config.power_drop_fraction
        return 2 * sum(v < level for v in inside) > len(inside)

    def _has_nvml(self, gpu: int) -> bool:
        st = self.gpus.get(gpu)
        return st is not None and bool(st.power or st.util)

    def _util_idle_inside(self, st: _GpuState, start: int, end: int) -> bool:
        return any(s.value <= 0.0 for s in st.util.inside(start, end))

    @staticmethod
    def _overlaps_emitted(st: _GpuState, start: int, end: int) -> bool:
        # Newest first: once a reach is at or before `start`, no gap from there back can
        # overlap, and gaps are emitted nearly in time order, so few are looked at.
        for gap, reach in reversed(st.emitted):
            if reach <= start:
                return False
            if gap.ts_ns < end and start < gap.end_ns:
                return True
        return False

    def _decide_nvml_only(
        self, index: int, st: _GpuState, c: _Candidate, pending_from: int | None
    ) -> list[GpuGap]:
        """pending_from: the earliest start among the GPU's pending host-side candidates
        (None: none pending), so that one ending before it needs no look at each."""
        if self._overlaps_emitted(st, c.start, c.end) or (
            pending_from is not None
            and pending_from < c.end
            and any(p.gpu == index and p.start < c.end and c.start < p.end for p in self.pending)
        ):
            return []  # a host-side gap covers it, with finer placement
        if 2 * self._busy_ns(index, st, c.start, c.end) >= c.end - c.start:
            return []  # traced syncs waited on the GPU through most of it: busy
        samples = st.power if c.source == "power" else st.util
        return [
            GpuGap(
                ts_ns=c.start,
                end_ns=c.end,
                gpu=index,
                sources=(c.source,),
                resolution_ns=max((s.period_ns for s in samples), default=0),
                confidence=0.6 if c.source == "power" else 0.5,
                tgids=st.pids,
            )
        ]
