"""Records the daemon derives from probe events: GPU idle gaps (and, from the attribution
engine, what each gap's time went to). They travel as events of their own kinds, so the
log, the socket stream and replay all use one serialisation."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from gpujitter.probes.events import Event, event_kind, native_frame
from gpujitter.units import format_bytes, format_ns


def unmeasured(ev: GpuGap | Attribution) -> str | None:
    """What no detector gives, so that a view would show it as measured: a negative
    resolution, a confidence outside 0..1 ("±-5ns", "-4000000000%"). (A gap that ends before
    it starts is refused for every kind by from_record.)"""
    if ev.resolution_ns < 0:
        return f"resolution_ns: negative ({ev.resolution_ns})"
    if not 0 <= ev.confidence <= 1:
        return f"confidence: outside 0..1 ({ev.confidence})"
    return None


def _negative(values: Iterable[tuple[str, int]]) -> str | None:
    """The first (place, value) whose value is below zero, as a problem."""
    return next((f"{where}: negative ({ns})" for where, ns in values if ns < 0), None)


@event_kind("gpu.gap")
@dataclass(frozen=True, slots=True)
class GpuGap(Event):
    """GPU `gpu` sat idle from ts_ns to end_ns.

    sources: the evidence that placed it ("cuda": a host-side launch gap, µs placement;
    "sched": the feeding thread's wake-up and run-queue wait inside a sync, µs; "baseline":
    the drain inside a preempted spinning sync, estimated from the thread's clean syncs (±
    their spread); "power": 20 ms NVML power samples; "util": 200 ms utilisation duty cycle).
    resolution_ns: how far start and end may be off. confidence: 0..1, how sure the
    detector is that the GPU was idle for the whole span. tgids: the processes feeding this
    GPU; tid_before/tid_after: the threads that launched last before and first after the
    gap (0 when unknown).
    """

    end_ns: int
    gpu: int
    sources: tuple[str, ...]
    resolution_ns: int
    confidence: float
    tgids: tuple[int, ...] = ()
    tid_before: int = 0
    tid_after: int = 0

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.ts_ns

    @property
    def gap_id(self) -> str:
        return f"{self.gpu}:{self.ts_ns}"

    def problem(self) -> str | None:
        return unmeasured(self)


# ---------------------------------------------------------------------------------------
# Attribution: what one gap's time went to (docs/attribution.md; the causes are
# daemon/analysis/engine/causes.py's table). Each kind of evidence says how one item of it reads
# (`line`); the breakdown lists every item under its cause, daemon/analysis/describe.py makes it
# printable.


def cpus_text(cpus: tuple[int, ...]) -> str:
    if not cpus:
        return ""
    return f" on CPU {cpus[0]}" if len(cpus) == 1 else f" on CPUs {','.join(map(str, cpus))}"


def task_name(task: TaskEvidence) -> str:
    """A task that ran instead, as people look for it: comm, process and thread, and the
    pod, container or Slurm job it runs in (a hog in another tenant's pod)."""
    pid = f"pid {task.tgid} " if task.tgid and task.tgid != task.tid else ""
    where = f" in {task.workload}" if task.workload else ""
    return f"{task.comm} ({pid}tid {task.tid}){where}"


def _times(count: int, ns: int) -> str:
    return f"{count}× {format_ns(ns)}" if count else format_ns(ns)


def _notes(*notes: str) -> str:
    kept = [n for n in notes if n]
    return f" ({', '.join(kept)})" if kept else ""


@dataclass(frozen=True, slots=True)
class IrqEvidence:
    """An interrupt that stole time from a feeding thread. remote_to_gpu: its device sits on
    another NUMA node than the GPU; handled_remote: the probe saw it handled on a CPU off its
    device's node. device_node is -1 when unknown (softirqs and vectors have no device)."""

    irq_kind: str  # hardirq, softirq, vector
    irq: int
    name: str
    cpus: tuple[int, ...]
    count: int
    ns: int
    device_node: int = -1
    remote_to_gpu: bool = False
    handled_remote: bool = False
    what: str = "irq"

    def words(self, gap_start_ns: int) -> str:
        """This item in words (describe.evidence_line makes it printable)."""
        number = f" {self.irq}" if self.irq_kind == "hardirq" else ""
        where = f"{self.irq_kind}{number} {self.name}{cpus_text(self.cpus)}"
        return f"{where}: {_times(self.count, self.ns)}" + _notes(
            f"device on node {self.device_node}" if self.device_node >= 0 else "",
            "remote to the GPU" if self.remote_to_gpu else "",
            "handled off its device's node" if self.handled_remote else "",
        )


@dataclass(frozen=True, slots=True)
class TaskEvidence:
    """A task that ran on the CPU a runnable feeding thread waited for: the one that held it
    longest during each wait (tid 0: the CPU was idle, or the task is unknown).
    after_migration: some of these waits followed a cross-NUMA migration of the waiting
    thread. own: the task is one of gpujitter's own threads (meta.self): the observer
    delayed the observed. tgid: its process (0 unknown); workload: that process's pod,
    container or Slurm job ("" none known)."""

    tid: int
    comm: str
    cpus: tuple[int, ...]
    count: int
    ns: int
    after_migration: bool = False
    own: bool = False
    what: str = "task"

    def words(self, gap_start_ns: int) -> str:
        who = task_name(self) if self.tid else "an idle CPU or an unknown task"
        flag = ", after a cross-NUMA migration" if self.after_migration else ""
        return f"waited behind {who}{cpus_text(self.cpus)}: {_times(self.count, self.ns)}{flag}"

    tgid: int = 0
    workload: str = ""


@dataclass(frozen=True, slots=True)
class MigrationEvidence:
    """A cross-NUMA migration of a feeding thread behind a run-queue wait or remote on-CPU time."""

    at_ns: int
    tid: int
    src_cpu: int
    dst_cpu: int
    src_node: int
    dst_node: int
    what: str = "migration"

    def words(self, gap_start_ns: int) -> str:
        return (
            f"tid {self.tid} migrated CPU {self.src_cpu} → {self.dst_cpu} "
            f"(node {self.src_node} → {self.dst_node}) at +{format_ns(self.at_ns - gap_start_ns)}"
        )


@dataclass(frozen=True, slots=True)
class IdleEvidence:
    """Wake-ups of a feeding thread onto CPUs that were idle in `state_name`."""

    state: int
    state_name: str
    cpus: tuple[int, ...]
    count: int
    ns: int
    exit_latency_ns: int
    what: str = "idle"

    def words(self, gap_start_ns: int) -> str:
        ns = self.exit_latency_ns
        latency = f" (exit latency {format_ns(ns)})" if ns >= 0 else ""
        return f"woken from {self.state_name}{cpus_text(self.cpus)}: " + (
            f"{_times(self.count, self.ns)}{latency}"
        )


@dataclass(frozen=True, slots=True)
class SyscallEvidence:
    """Off-CPU time in one state and system call ("" and nr -1: not in a system call)."""

    state: str
    syscall: str
    nr: int
    count: int
    ns: int
    what: str = "syscall"

    def words(self, gap_start_ns: int) -> str:
        call = self.syscall or (f"syscall {self.nr}" if self.nr >= 0 else "")
        return f"{self.state}{f' in {call}' if call else ''}: {_times(self.count, self.ns)}"


@dataclass(frozen=True, slots=True)
class IoEvidence:
    """Waits of a feeding thread on block I/O: uninterruptible sleeps that the completion of
    a request to device `dev` (MAJ:MIN) ended. name: the disk (vda, nvme0n1; "" when the
    topology does not list it); node: its NUMA node (-1 unknown); op: read, write or other;
    syscall: the call the thread waited in ("" none: a page fault, say); count: waits;
    bytes: the sizes of the requests whose completion woke it (what it waited for last,
    not all it read)."""

    dev: str
    name: str
    node: int
    op: str
    syscall: str
    count: int
    ns: int
    bytes: int
    remote_to_gpu: bool = False
    what: str = "io"

    def words(self, gap_start_ns: int) -> str:
        call = f" in {self.syscall}" if self.syscall else ""
        size = f", {format_bytes(self.bytes)}" if self.bytes else ""
        what = f"{self.op or 'I/O'} on {self.name or self.dev}{call}"
        return f"{what}: {_times(self.count, self.ns)}{size}" + _notes(
            f"device on node {self.node}" if self.node >= 0 else "",
            "remote to the GPU" if self.remote_to_gpu else "",
        )


@dataclass(frozen=True, slots=True)
class FaultEvidence:
    """Page faults: kind swap (read back from swap), file (major, file-backed) or minor.
    Minor fault counts are the share of each in-kernel window that fell inside the gap."""

    kind: str
    count: int
    ns: int
    cpus: tuple[int, ...]
    addresses: tuple[int, ...] = ()  # faulting addresses of major faults, earliest first
    what: str = "fault"

    def words(self, gap_start_ns: int) -> str:
        first = f", first at {self.addresses[0]:#x}" if self.addresses else ""
        where = f"{self.kind} faults{cpus_text(self.cpus)}"
        return f"{where}: {self.count}× {format_ns(self.ns)}{first}"


@dataclass(frozen=True, slots=True)
class AllocEvidence:
    """Slow allocator calls: a system call (allocator "") or a uprobe-timed library call."""

    call: str
    allocator: str
    count: int
    ns: int
    bytes: int
    what: str = "alloc"

    def words(self, gap_start_ns: int) -> str:
        who = f" ({self.allocator})" if self.allocator else ""
        size = f", {format_bytes(self.bytes)}" if self.bytes else ""
        return f"{self.call}{who}: {_times(self.count, self.ns)}{size}"


@dataclass(frozen=True, slots=True)
class GcEvidence:
    """CPython cyclic-GC collections of one generation (-1: the build does not say) in a
    feeding thread's on-CPU time: count collections, ns of them inside the gap, dur_ns their
    whole length (inside the gap or not), collected the objects they freed (-1 unknown)."""

    generation: int
    count: int
    ns: int
    dur_ns: int
    collected: int = -1
    what: str = "gc"

    def words(self, gap_start_ns: int) -> str:
        gen = self.generation
        which = f"generation {gen}" if gen >= 0 else "generation unknown"
        freed = f", {self.collected} objects freed" if self.collected >= 0 else ""
        return f"GC {which}: {_times(self.count, self.ns)}, {format_ns(self.dur_ns)} in all{freed}"


@dataclass(frozen=True, slots=True)
class GilEvidence:
    """A feeding thread waiting to take CPython's GIL while thread holder_tid (holder_comm;
    0: not known) held it: count waits, ns of them inside the gap, dur_ns their whole
    length; holder_cause: what the holder's own time inside those waits went to most (a
    cause name, "" when not divided), for holder_cause_ns of it; holder_func (in
    holder_file, defined at holder_line): the Python function the python_stacks probe
    sampled the holder in most often inside its host work there ("" when none)."""

    holder_tid: int
    holder_comm: str
    count: int
    ns: int
    dur_ns: int
    holder_cause: str = ""
    holder_cause_ns: int = 0
    holder_func: str = ""
    holder_file: str = ""
    holder_line: int = 0
    what: str = "gil"

    @property
    def holder(self) -> str:
        """The holder, what it was doing and in which Python function, in words ("" when
        not known)."""
        if not self.holder_tid:
            return ""
        doing = f", {self.holder_cause.replace('_', ' ')} there" if self.holder_cause else ""
        where = f", in {frame_where(self.holder_func, self.holder_file, self.holder_line)}"
        return f"{self.holder_comm or 'thread'} (tid {self.holder_tid}){doing}" + (
            where if self.holder_func else ""
        )

    def words(self, gap_start_ns: int) -> str:
        who = self.holder or "a thread not known"
        return f"GIL held by {who}: {_times(self.count, self.ns)}, {format_ns(self.dur_ns)} in all"


def frame_where(func: str, file: str, line: int) -> str:
    """A sampled frame as people look for it: a Python function as "name (file:line)", a
    native one (events.native_frame) as "native name (module's file name)"."""
    if not native_frame(func, line):
        return f"{func} ({file}:{line})"
    return f"native {func} ({os.path.basename(file)})" if file else f"native {func}"


@dataclass(frozen=True, slots=True)
class FrameEvidence:
    """A function the host-work threads were in: samples of the python_stacks probe taken
    inside the part's time whose innermost Python frame was func (defined in file at line),
    or with no Python frame, whose native frame was func (in module `file`, line
    NATIVE_LINE); func "": neither known. Of `of` samples in all; ns: the part's time in
    that proportion."""

    func: str
    file: str
    line: int
    samples: int
    of: int
    ns: int
    what: str = "frame"

    @property
    def where(self) -> str:
        """The function as people look for it (frame_where)."""
        return frame_where(self.func, self.file, self.line) if self.func else "no Python frame"

    @property
    def share(self) -> str:
        plural = "s" if self.of != 1 else ""
        return f"{100 * self.samples // max(1, self.of)}% of {self.of} sample{plural}"

    def words(self, gap_start_ns: int) -> str:
        kind = "" if native_frame(self.func, self.line) else "Python "
        return f"{kind}{self.where}: {self.share}, ~{format_ns(self.ns)}"


@dataclass(frozen=True, slots=True)
class NodeEvidence:
    """On-CPU time on one NUMA node (cpus: where it ran, when known)."""

    node: int
    cpus: tuple[int, ...]
    ns: int
    remote: bool
    what: str = "node"

    def words(self, gap_start_ns: int) -> str:
        where = "remote" if self.remote else "local"
        return f"on-CPU on node {self.node} ({where}){cpus_text(self.cpus)}: {format_ns(self.ns)}"


REASONS = {
    "no_thread": "no feeding thread known",
    "no_data": "no probe data for the span",
    "short_offcpu": "off-CPU spans below the probe's threshold",
    "evicted": "data evicted before the gap was attributed",
}


@dataclass(frozen=True, slots=True)
class ReasonEvidence:
    """Why time stayed unexplained: no_thread, no_data, short_offcpu, evicted."""

    reason: str
    ns: int
    what: str = "reason"

    def words(self, gap_start_ns: int) -> str:
        return f"{REASONS.get(self.reason, self.reason)}: {format_ns(self.ns)}"


# A tagged union: a record read back picks its member by "what" (probes/events.py TAG).
Evidence = (
    IrqEvidence
    | TaskEvidence
    | MigrationEvidence
    | IdleEvidence
    | SyscallEvidence
    | IoEvidence
    | FaultEvidence
    | AllocEvidence
    | GcEvidence
    | GilEvidence
    | FrameEvidence
    | NodeEvidence
    | ReasonEvidence
)


@dataclass(frozen=True, slots=True)
class Part:
    """The share of a gap that went to one cause; tids: the threads whose time it was."""

    cause: str
    ns: int
    tids: tuple[int, ...] = ()
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True, slots=True)
class CauseTime:
    """One cause's time in one thread's own share of a gap."""

    cause: str
    ns: int


@dataclass(frozen=True, slots=True)
class ThreadRole:
    """A thread behind an attribution. role: critical (its timeline is the gap's path), waker
    (a wait on the path ended when it woke the waiting thread: its time replaced the wait),
    before (launched last before the gap), sibling (another thread of a feeding process).
    ns: its time on the path (critical, waker: with the time of the wakers followed from
    it) or, for the others, the time of its own top cause inside the gap. hops: a waker's
    distance from the critical thread (1: it woke the critical thread); woke: the thread
    whose wait it ended (0 for the other roles). causes: its own time per cause, largest
    first (a waker's in another process too: a data-loader worker's host work, faults,
    run-queue waits). workload: its process's pod, container or Slurm job ("" none known;
    probes/workload.py label)."""

    tid: int
    tgid: int
    comm: str
    role: str
    ns: int
    top_cause: str = ""
    hops: int = 0
    woke: int = 0
    causes: tuple[CauseTime, ...] = ()
    workload: str = ""


@event_kind("gpu.attribution")
@dataclass(frozen=True, slots=True)
class Attribution(Event):
    """Where the feeding threads' time went while GPU `gpu` sat idle from ts_ns to end_ns.

    parts: one per cause with time, largest first; they sum to the gap exactly. tid/tgid/comm:
    the critical thread (0 and "" when no feeding thread was known). sources, resolution_ns
    and confidence are the gap's. gpu_node: -1 when unknown. remedies: one line per top
    cause. probes_off: probes not running at the gap's end (their causes cannot be seen).
    workload: the critical thread's pod, container or Slurm job, else the first feeding
    process's ("" none known), from the meta.workload events seen before the gap's release.
    self_ns: the part of the gap the feeding threads waited behind gpujitter's own threads
    (evidence marked `own`); a gap with any is self-inflicted.
    """

    NESTED = True

    end_ns: int
    gpu: int
    sources: tuple[str, ...]
    resolution_ns: int
    confidence: float
    parts: tuple[Part, ...]
    tgids: tuple[int, ...] = ()
    tid: int = 0
    tgid: int = 0
    comm: str = ""
    gpu_node: int = -1
    threads: tuple[ThreadRole, ...] = ()
    remedies: tuple[str, ...] = ()
    probes_off: tuple[str, ...] = ()
    workload: str = ""
    self_ns: int = 0

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.ts_ns

    @property
    def gap_id(self) -> str:
        return f"{self.gpu}:{self.ts_ns}"

    def problem(self) -> str | None:
        # A share, a thread's time or a waker's distance below zero is no measurement either.
        return unmeasured(self) or _negative((
            ("self_ns", self.self_ns),
            *((f"parts[{i}].ns", p.ns) for i, p in enumerate(self.parts)),
            *((f"threads[{i}].ns", t.ns) for i, t in enumerate(self.threads)),
            *((f"threads[{i}].hops", t.hops) for i, t in enumerate(self.threads)),
            *((f"threads[{i}].causes[{j}].ns", c.ns)
              for i, t in enumerate(self.threads) for j, c in enumerate(t.causes)),
        )) or self._unsummed()  # fmt: skip

    def _unsummed(self) -> str | None:
        """Parts that do not add up to the gap: the engine divides a gap's integer ns among
        its causes exactly, and the log and the stream write them as JSON integers, never
        rounded; parts past the gap would show shares over 100 %, parts short of it time
        gone to no cause. The one slack is that of a tool that reads JSON numbers as doubles
        (jq before 1.7, a browser's JSON.parse), through which a log may have been filtered:
        past 2**53 ns of uptime (104 days) it gives ts_ns and end_ns back each rounded to a
        double's spacing there (2 ns, 4 past 2**54 ...), their difference within one
        spacing; the parts, far below 2**53, come back exact."""
        total = sum(p.ns for p in self.parts)
        bits = self.end_ns.bit_length()
        slack = 1 << (bits - 53) if bits > 53 else 0
        if abs(total - self.dur_ns) <= slack:
            return None
        return f"parts add up to {total} ns, the gap is {self.dur_ns} ns"

    @property
    def gap(self) -> GpuGap:
        """The gap it attributes, as far as the attribution repeats it (the threads that
        launched around it are not repeated)."""
        return GpuGap(
            ts_ns=self.ts_ns,
            end_ns=self.end_ns,
            gpu=self.gpu,
            sources=self.sources,
            resolution_ns=self.resolution_ns,
            confidence=self.confidence,
            tgids=self.tgids,
        )

    @property
    def top(self) -> Part | None:
        """The largest part (None: a gap with no time to divide)."""
        return self.parts[0] if self.parts else None

    def share(self, part: Part) -> float:
        return part.ns / self.dur_ns if self.dur_ns > 0 else 0.0

    @property
    def self_inflicted(self) -> bool:
        """gpujitter's own threads took some of this gap's time (docs/attribution.md)."""
        return self.self_ns > 0

    @property
    def top_cause(self) -> str:
        return self.parts[0].cause if self.parts else "unexplained"

    def holder(self, part: Part) -> tuple[int, ThreadRole] | None:
        """The waker holding most of a part's time when a wait was followed into the thread
        that ended it (its ns of the part, the waker); None when no waker holds any."""
        holders = [
            (c.ns, -r.tid, r)
            for r in self.threads
            if r.role == "waker"
            for c in r.causes
            if c.cause == part.cause
        ]
        if not holders:
            return None
        ns, _, role = max(holders, key=lambda h: h[:2])
        return ns, role
