"""Typed events: what probes and the GPU side hand to the daemon, and what a trace records.

One frozen, slotted dataclass per kind, registered under a stable type name ("sched.offcpu")
that traces and sockets carry. Every timestamp is CLOCK_MONOTONIC nanoseconds (the clock of
bpf_ktime_get_ns and time.monotonic_ns); wall time exists only at the edges, through the
ClockRef recorded with each trace. Common fields: ts_ns (when the interval or fact began),
tid/tgid (kernel thread and process ids), cpu.

Compatibility (docs/schema.md): adding a kind or an optional field (with a default) is a
minor schema change; renaming or removing one, or changing a unit, is a major one.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, Literal, TypeVar

import orjson

from gpujitter.probes.workload import Workload
from gpujitter.text import dumps

SCHEMA_MAJOR = 1
SCHEMA_MINOR = 11

_KINDS: dict[str, type[Event]] = {}
_FIELDS: dict[str, tuple[str, ...]] = {}  # kind -> field names
# Nested records of a union are told apart by this field (its default names the member).
TAG = "what"

E = TypeVar("E", bound="type[Event]")


def event_kind(name: str):
    """Register a dataclass as an event kind under `name` (the "type" field on the wire)."""

    def register(cls: E) -> E:
        if name in _KINDS:
            raise ValueError(f"event kind {name!r} registered twice")
        cls.KIND = name
        _KINDS[name] = cls
        # Computed once per kind: dataclasses.fields() per event dominated trace reading.
        _FIELDS[name] = tuple(f.name for f in dataclasses.fields(cls))
        cls.__init__ = _slot_init(cls)  # type: ignore[method-assign]
        return cls

    return register


def _slot_init(cls: type) -> Callable[..., None]:
    """The dataclass's __init__, each field stored through its slot's descriptor. A frozen
    dataclass's own __init__ stores each by object.__setattr__(self, "name", value): for an
    18-field sched.offcpu that was 3.6 µs of the probe thread's ~6 µs to decode a record
    (an eighth of its time beside the H200 training job); this one takes 1.7 µs. Same
    parameters, defaults and order; instances stay frozen (only the descriptors write)."""
    fields = dataclasses.fields(cls)
    if any(f.default_factory is not MISSING or not f.init for f in fields):
        raise TypeError(f"{cls.__name__}: an event's fields take plain defaults only")
    env: dict[str, Any] = {}
    params, body = [], []
    for f in fields:
        env[f"_set_{f.name}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
        if f.default is MISSING:
            params.append(f.name)
        else:
            env[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body), env)
    init: Callable[..., None] = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


@dataclass(frozen=True, slots=True)
class Event:
    KIND: ClassVar[str] = ""
    # True for kinds whose fields hold dataclasses (the daemon's derived records): to_record
    # then turns those into dicts, and from_record builds them again from their annotations.
    NESTED: ClassVar[bool] = False
    ts_ns: int

    def problem(self) -> str | None:
        """What makes a well-typed record of this kind no possible measurement (None when
        nothing does): from_record refuses it, for every reader alike."""
        return None


def event_kinds() -> dict[str, type[Event]]:
    return dict(_KINDS)


def to_record(ev: Event) -> dict[str, Any]:
    """The event as a plain dict with its kind under "type" (what orjson writes)."""
    rec: dict[str, Any] = {"type": ev.KIND}
    for name in _FIELDS[ev.KIND]:
        rec[name] = getattr(ev, name)
    if ev.NESTED:
        return {k: _plain(v) for k, v in rec.items()}
    return rec


_JSON_HEADS: dict[tuple[bytes, str], bytes] = {}  # (lead, kind) -> `{LEAD"type":KIND,`


def to_json(ev: Event, lead: bytes = b"") -> bytes:
    """orjson.dumps(to_record(ev)), with `lead` (members in JSON, each with its comma:
    b'"schema":"x",') before the kind: orjson writes the dataclass itself (its fields in
    order, nested records as objects) without the dict being built, for the sinks that
    write every event or every attribution. Every event has a field (ts_ns), so the
    object after the kind is never empty."""
    head = _JSON_HEADS.get((lead, ev.KIND))
    if head is None:
        head = _JSON_HEADS[lead, ev.KIND] = b"{" + lead + b'"type":' + orjson.dumps(ev.KIND) + b","
    return head + dumps(ev)[1:]  # (dumps: a name of bytes that are not UTF-8 written as such)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


class BadRecord(ValueError):
    """A record that is not an event this version can build: its one-line reason."""


class UnknownEvent(BadRecord):
    pass


def from_record(rec: dict[str, Any]) -> Event:
    """Inverse of to_record, checking every field against the kind's annotations (a record
    read from a file or a socket is untrusted). Unknown fields are dropped (a newer minor
    version added them); lists become tuples so that events stay hashable and compare equal
    after a round trip. Raises UnknownEvent for a kind not registered, BadRecord for a
    record that is not one of its kind, naming the field (e.g. parts[0].ns)."""
    if not isinstance(rec, dict):
        raise BadRecord(f"record is {_json_type(rec)}, not an object")
    kind = rec.get("type")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UnknownEvent(f"unknown event type {kind!r}")
    try:
        ev: Event = typed(cls, rec)
    except BadRecord as err:
        raise BadRecord(f"bad {kind} record: {err}") from None
    if (why := _no_measurement(ev) or ev.problem()) is not None:
        raise BadRecord(f"bad {kind} record: {why}")
    return ev


# CLOCK_MONOTONIC counts from boot: 2**60 ns is 36 years of uptime, which no machine has run.
UPTIME_MAX_NS = 2**60
# NVML numbers a node's GPUs from 0, far fewer than this: a crafted file of 300,000 GPU
# indexes took 1.2 GB of the reader's memory (state per GPU).
GPUS_MAX = 1024


def end_of(ev: Event) -> int:
    """When what an event tells ends: its end_ns, or ts_ns on by its duration or the
    interval it totals (the engine's watermark moves to it)."""
    end = ev.ts_ns + max(getattr(ev, "dur_ns", 0), getattr(ev, "interval_ns", 0), 0)
    return max(end, getattr(ev, "end_ns", 0))


def _no_measurement(ev: Event) -> str | None:
    """What no record of any kind holds: times no clock gave (CLOCK_MONOTONIC is never
    negative nor decades past a boot, a span never ends before it begins, no duration is
    negative: a made-up line's ts_ns -5 read as a gap of 324 s; one event ending at 2**62 ns
    moved the engine's clock past every other, which it then dropped as too late), or a GPU
    index no node has."""
    if ev.ts_ns < 0:
        return f"ts_ns: negative ({ev.ts_ns})"
    end = getattr(ev, "end_ns", None)
    if type(end) is int and end < ev.ts_ns:
        return f"end_ns {end} before ts_ns {ev.ts_ns}"
    for name in ("dur_ns", "interval_ns"):
        if getattr(ev, name, 0) < 0:
            return f"{name}: negative ({getattr(ev, name)})"
    if (last := end_of(ev)) > UPTIME_MAX_NS:
        return f"ends at {last} ns, decades past any boot (CLOCK_MONOTONIC)"
    if not -1 <= (gpu := getattr(ev, "gpu", 0)) < GPUS_MAX:
        return f"gpu: {gpu}, no GPU index (0 to {GPUS_MAX - 1}, or -1: not known)"
    return None


def typed(hint: Any, value: Any, where: str = "") -> Any:
    """`value` (as JSON gives it) checked against the annotation `hint`, and converted where
    JSON cannot say the type: lists to tuples, objects to dataclasses, decimal keys of
    dict[int, ...] to ints, ints to floats. Ints are ints, not bools or floats; strs and
    bools likewise. Raises BadRecord naming the place (under `where`, e.g. "topology")."""
    try:
        return _check(hint)(value)
    except _Misplaced as err:
        raise err.at(where) if where else err from None


Check = Callable[[Any], Any]
_CHECKS: dict[Any, Check] = {}


class _Misplaced(BadRecord):
    """Raised where the wrong value sits; each enclosing check prefixes its place."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why, self.where = why, ""

    def at(self, place: str) -> _Misplaced:
        self.where = place + ("." if self.where[:1] not in ("", "[") else "") + self.where
        return self

    def __str__(self) -> str:
        return f"{self.where or 'value'}: {self.why}"


def _wrong(want: str, value: Any) -> _Misplaced:
    return _Misplaced(f"want {want}, got {_json_type(value)}")


def _json_type(value: Any) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "object"}
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)


def _check(hint: Any) -> Check:
    """The check for one annotation, built once and cached (reading a trace calls it per
    field of every record)."""
    check = _CHECKS.get(hint)
    if check is None:
        check = _CHECKS[hint] = _build(hint)
    return check


def _build(hint: Any) -> Check:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda v: v
    if hint in (int, str, bool):
        return _exactly(hint)
    if hint is float:
        return _float
    if origin is Literal:
        return _exactly(type(args[0]))  # values a newer minor adds are kept, not refused
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _items(_check(args[0]))
    if origin is tuple:
        return _row(tuple(_check(a) for a in args))
    if origin in (dict, Mapping):
        return _mapping(_int_key if args[0] is int else _check(args[0]), _check(args[1]))
    if origin in (types.UnionType, typing.Union):
        return _union(args)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _record(hint)
    raise TypeError(f"no check for annotation {hint!r}")


def _exactly(cls: type) -> Check:
    want = _json_type(cls())

    def check(v: Any) -> Any:
        if type(v) is not cls:
            raise _wrong(want, v)
        return v

    return check


def _float(v: Any) -> float:
    if type(v) not in (float, int):
        raise _wrong("float", v)
    return float(v)


def _each(checks: Iterable[Check], values: Iterable[Any]) -> tuple[Any, ...]:
    out = []
    for i, (check, v) in enumerate(zip(checks, values, strict=False)):  # checks may repeat
        try:
            out.append(check(v))
        except _Misplaced as err:
            raise err.at(f"[{i}]") from None
    return tuple(out)


def _items(item: Check) -> Check:
    def check(v: Any) -> tuple[Any, ...]:
        if not isinstance(v, list | tuple):
            raise _wrong("list", v)
        return _each(itertools.repeat(item), v)

    return check


def _row(items: tuple[Check, ...]) -> Check:
    def check(v: Any) -> tuple[Any, ...]:
        if not isinstance(v, list | tuple) or len(v) != len(items):
            raise _wrong(f"list of {len(items)}", v)
        return _each(items, v)

    return check


def _int_key(k: Any) -> int:
    """JSON object keys are strings: an int key is written in decimal."""
    if type(k) is str and k.isascii() and k.removeprefix("-").isdigit():
        return int(k)
    raise _wrong("int key", k)


def _mapping(key: Check, val: Check) -> Check:
    def check(v: Any) -> dict[Any, Any]:
        if not isinstance(v, dict):
            raise _wrong("object", v)
        out = {}
        for k, x in v.items():
            try:
                out[key(k)] = val(x)
            except _Misplaced as err:
                raise err.at(str(k)) from None
        return out

    return check


def _union(args: tuple[Any, ...]) -> Check:
    optional = type(None) in args
    members = [a for a in args if a is not type(None)]
    if len(members) == 1:
        one = _check(members[0])
        return lambda v: None if v is None and optional else one(v)
    if not all(dataclasses.is_dataclass(m) for m in members):
        raise TypeError(f"a union of {args!r} has no tag to tell its members apart")
    by_tag = {m.__dataclass_fields__[TAG].default: m for m in members}

    def check(v: Any) -> Any:
        if v is None and optional:
            return None
        tag = v.get(TAG) if isinstance(v, dict) else None
        member = by_tag.get(tag) if isinstance(tag, str) else None
        if member is None:
            raise _Misplaced(f"want one of {', '.join(by_tag)}").at(TAG)
        return _check(member)(v)

    return check


def _record(cls: type) -> Check:
    hints = typing.get_type_hints(cls)
    fields = [
        (f.name, _check(hints[f.name]), f.default is MISSING and f.default_factory is MISSING)
        for f in dataclasses.fields(cls)
    ]
    want = f"{cls.__name__} object"

    def check(v: Any) -> Any:
        if not isinstance(v, dict):
            raise _wrong(want, v)
        kwargs = {}
        for name, field_check, required in fields:
            if name in v:
                try:
                    kwargs[name] = field_check(v[name])
                except _Misplaced as err:
                    raise err.at(name) from None
            elif required:
                raise _Misplaced("missing").at(name)
        return cls(**kwargs)

    return check


# ---------------------------------------------------------------------------------------
# Meta: clocks, probe health, processes.


@event_kind("meta.clock")
@dataclass(frozen=True, slots=True)
class ClockRef(Event):
    """A pair of readings taken back to back: wall = realtime_ns + (mono - ts_ns)."""

    realtime_ns: int


# A probe's states, as meta.probe records and the metrics name them.
ProbeState = Literal["running", "degraded", "unavailable", "off", "stopped"]
# The meta.probe of the core module (probes/watch.py), which every probe set loads: no
# probe, but its programs (fork, exec, exit) have a cost and its records losses too.
CORE_PROBE = "core"


@event_kind("meta.probe")
@dataclass(frozen=True, slots=True)
class ProbeStatus(Event):
    """A probe's health (or the core module's: CORE_PROBE), sent at start, on every state
    change and periodically."""

    probe: str
    state: ProbeState
    reason: str = ""  # why not running, or what a degraded probe lacks
    events: int = 0  # delivered to user space since start
    lost_kernel: int = 0  # lost in the kernel: ring-buffer reserve failures, irq's map losses
    lost_user: int = 0  # dropped in Python (queue full)
    # What the probe's BPF programs cost the kernel: CPU ns and program runs per second over
    # the last measured stretch; -1 until measured. cost_from: "bpf_stats" (the kernel's
    # statistics were on: continuous), "sampled" (switched on by gpujitter for 1 s a
    # minute), "with PROBE" (its programs are PROBE's too and counted there: swap's with
    # faults), "pending" (programs that came after the last sampled second, measured in the
    # next), "" (not measured: no BPF programs, or statistics refused).
    bpf_ns_per_s: int = -1
    bpf_runs_per_s: int = -1
    cost_from: str = ""


@event_kind("meta.exec")
@dataclass(frozen=True, slots=True)
class ProcExec(Event):
    """A process started a new program (sched_process_exec); feeds the watched set."""

    tgid: int
    comm: str
    filename: str = ""


@event_kind("meta.exit")
@dataclass(frozen=True, slots=True)
class ProcExit(Event):
    """A watched process ended (its last thread)."""

    tgid: int
    comm: str


@event_kind("meta.thread_exit")
@dataclass(frozen=True, slots=True)
class ThreadExit(Event):
    """A thread of a watched process ended, the process living on."""

    tgid: int
    tid: int


@event_kind("meta.watch")
@dataclass(frozen=True, slots=True)
class WatchChange(Event):
    """The watched set gained or lost processes (and why: pid, comm, cgroup, gpu, fork)."""

    added: tuple[int, ...]
    removed: tuple[int, ...]
    reason: str


@event_kind("meta.self")
@dataclass(frozen=True, slots=True)
class OwnThreads(Event):
    """gpujitter's own process (tgid) and threads (tids) when it sent this: a watched thread
    that waited behind one of them was delayed by the observer itself (a self-inflicted
    wait). Sent at start and whenever the set of threads changes, so a replay tells them
    apart as the live daemon did."""

    tgid: int
    tids: tuple[int, ...]


@event_kind("meta.workload")
@dataclass(frozen=True, slots=True)
class WorkloadInfo(Event):
    """Where a process that joined the watched set runs (probes/workload.py): its container,
    pod or Slurm job, read from its cgroup path and its container runtime's files. Sent once
    per process and only for one in such a workload; the engine labels records with it."""

    NESTED = True

    tgid: int
    workload: Workload


@event_kind("meta.lost")
@dataclass(frozen=True, slots=True)
class RecordsLost(Event):
    """`count` events between since_ns and ts_ns are missing from the trace that holds this
    record: the disk refused them (full, quota, I/O error); `reason` says what it said."""

    count: int
    since_ns: int
    reason: str = ""


@event_kind("meta.hist")
@dataclass(frozen=True, slots=True)
class Log2Hist(Event):
    """What one in-kernel log2 histogram of a probe counted over [ts_ns, ts_ns + interval_ns):
    (lo, count) pairs, the bucket holding values in [lo, 2 * lo) of `unit` (lo 1 also 0)."""

    interval_ns: int
    probe: str
    name: str  # e.g. "runq", "offcpu.sleeping", "wake_to_run.HLT"
    buckets: tuple[tuple[int, int], ...]
    unit: str = "ns"


# ---------------------------------------------------------------------------------------
# sched: off-CPU intervals, run-queue waits, migrations, per-node on-CPU time.


@event_kind("sched.offcpu")
@dataclass(frozen=True, slots=True)
class OffCpu(Event):
    """A watched thread was off CPU from ts_ns to end_ns. It left `cpu` in `state`; it became
    runnable at runnable_ns (== ts_ns when preempted) and waited on the run queue of cpu_in
    until end_ns, behind other_tid/other_comm: the task that held the CPU longest during the
    wait, for other_ns of it; with other_ns 0 (not followed, or a trace before schema 1.6),
    the task it switched in after. other_tgid: that task's process (0: unknown, or gone
    before it was looked up; from schema 1.6), whose workload a meta.workload names.
    Emitted when the whole interval or the run-queue wait exceeds the probe's thresholds.
    io_dev: when the completion of a block request woke it from uninterruptible sleep (an
    I/O wait), that request's device as MAJ:MIN ("" otherwise), with its size and direction
    (io_op: read, write or other)."""

    end_ns: int
    tid: int
    tgid: int
    cpu: int
    cpu_in: int
    state: Literal["preempted", "uninterruptible", "sleeping", "stopped", "other"]
    runnable_ns: int
    waker_tid: int = 0
    syscall: int = -1  # syscall number the thread blocked in, -1 when not in a syscall
    other_tid: int = 0
    other_comm: str = ""
    comm: str = ""
    io_dev: str = ""
    io_bytes: int = 0
    io_op: str = ""
    other_tgid: int = 0
    other_ns: int = 0

    @property
    def runq_ns(self) -> int:
        return self.end_ns - self.runnable_ns


@event_kind("sched.offcpu_open")
@dataclass(frozen=True, slots=True)
class OffCpuOpen(Event):
    """A watched thread has been off CPU since ts_ns and still was at as_of_ns: what is known
    of an interval whose OffCpu comes only when it ends, maybe long after the gaps it
    overlaps are attributed. Read from the probe's per-thread state once a second, one per
    interval, once it has lasted the `offcpu` threshold (so that its OffCpu, with the same
    ts_ns, follows). state and syscall as OffCpu's at the switch-out (schema 1.11)."""

    as_of_ns: int
    tid: int
    tgid: int
    state: Literal["preempted", "uninterruptible", "sleeping", "stopped", "other"]
    syscall: int = -1


@event_kind("sched.migrate")
@dataclass(frozen=True, slots=True)
class Migration(Event):
    tid: int
    tgid: int
    src_cpu: int
    dst_cpu: int
    src_node: int
    dst_node: int
    comm: str = ""

    @property
    def cross_node(self) -> bool:
        return self.src_node != self.dst_node


@event_kind("sched.nodetime")
@dataclass(frozen=True, slots=True)
class NodeTime(Event):
    """On-CPU time of one watched thread per NUMA node over [ts_ns, ts_ns + interval_ns)."""

    interval_ns: int
    tid: int
    tgid: int
    node_ns: tuple[tuple[int, int], ...]  # (node, on-CPU ns) pairs


@event_kind("sched.thread")
@dataclass(frozen=True, slots=True)
class ThreadSched(Event):
    """Scheduling totals of one watched thread over [ts_ns, ts_ns + interval_ns), from the
    in-kernel counters (every interval, not only those above the thresholds). Off-CPU and
    run-queue time count when the interval ends (the thread runs again)."""

    interval_ns: int
    tid: int
    tgid: int
    oncpu_ns: int
    offcpu_ns: int
    runq_ns: int
    switches: int  # times it left a CPU
    preemptions: int  # of which while still runnable
    migrations: int
    cross_node_migrations: int


# ---------------------------------------------------------------------------------------
# irq: interrupt work that ran while a watched thread was current on that CPU.


@event_kind("irq.stolen")
@dataclass(frozen=True, slots=True)
class IrqStolen(Event):
    """`count` handlers of one IRQ/softirq/vector ran on `cpu` between ts_ns and end_ns while
    watched thread `tid` was current there, taking total_ns of its time. `remote` marks an IRQ
    whose device sits on another NUMA node than the CPU that handled it."""

    end_ns: int
    tid: int
    tgid: int
    cpu: int
    irq_kind: Literal["hardirq", "softirq", "vector"]
    irq: int  # IRQ number, softirq vector number, or x86 vector id
    name: str
    count: int
    total_ns: int
    remote: bool = False

    def problem(self) -> str | None:
        return _within_span(self)


@event_kind("cpu.stats")
@dataclass(frozen=True, slots=True)
class CpuStats(Event):
    """Per-CPU totals over [ts_ns, ts_ns + interval_ns): interrupt time and idle residency."""

    interval_ns: int
    cpu: int
    hardirq_ns: int = 0
    softirq_ns: int = 0
    vector_ns: int = 0
    idle_ns: tuple[tuple[str, int], ...] = ()  # (idle state name, residency ns)
    top_irqs: tuple[tuple[str, int, int], ...] = ()  # (name, ns, count), largest first
    # Hard IRQs handled here whose device sits on another NUMA node: (name, ns, count).
    remote_irqs: tuple[tuple[str, int, int], ...] = ()


# ---------------------------------------------------------------------------------------
# faults and swap.


@event_kind("fault.minor")
@dataclass(frozen=True, slots=True)
class MinorFaults(Event):
    """`count` minor faults of one thread between ts_ns and end_ns, total_ns spent in them
    (with the trap exit and entry between faults that followed each other at once)."""

    end_ns: int
    tid: int
    tgid: int
    cpu: int
    count: int
    total_ns: int

    def problem(self) -> str | None:
        return _within_span(self)


def _within_span(ev: IrqStolen | MinorFaults) -> str | None:
    """Handlers or faults counted between ts_ns and end_ns (the first's start, the last's
    end) took no more than that span, and none took less than nothing: one irq.stolen of
    2**64-1 ns read 1.3 ms of IRQ time in a recording as 323 ms. (Over 2,602 such records
    of the H200, an H100 host and the dev VM, the total reached the span exactly at most.)"""
    if ev.count < 0 or ev.total_ns < 0:
        return f"count {ev.count}, total_ns {ev.total_ns}: negative"
    if ev.total_ns > ev.end_ns - ev.ts_ns:
        return f"total_ns {ev.total_ns} longer than its span ({ev.end_ns - ev.ts_ns} ns)"
    return None


@event_kind("fault.major")
@dataclass(frozen=True, slots=True)
class MajorFault(Event):
    """One major fault from ts_ns for dur_ns. kind: "file" (read a file page) or "swap"
    (an anonymous or shmem page read back from swap)."""

    dur_ns: int
    tid: int
    tgid: int
    cpu: int
    kind: Literal["file", "swap"]
    address: int
    comm: str = ""


@event_kind("fault.stats")
@dataclass(frozen=True, slots=True)
class FaultStats(Event):
    """Page faults of one thread over [ts_ns, ts_ns + interval_ns), from in-kernel counters:
    how many of each class and the time spent in them. unclassified: major faults that were
    neither a file read nor a swap read (device memory, zswap hits, waits on another
    thread's read); untimed: completions whose entry was not seen (in no other count)."""

    interval_ns: int
    tid: int
    tgid: int
    minor_count: int = 0
    minor_ns: int = 0
    file_count: int = 0
    file_ns: int = 0
    swap_count: int = 0
    swap_ns: int = 0
    unclassified_count: int = 0
    unclassified_ns: int = 0
    untimed_count: int = 0


# ---------------------------------------------------------------------------------------
# cstate: wake-ups of watched threads onto CPUs that were idle.


@event_kind("cstate.wake")
@dataclass(frozen=True, slots=True)
class IdleWake(Event):
    """Watched thread `tid` was woken at ts_ns onto `cpu`, which had idled idle_ns (since it
    last ran a task), the last in_state_ns of it in `state` (exit latency from cpuidle sysfs,
    -1 when not published); it ran wake_to_run_ns later."""

    tid: int
    tgid: int
    cpu: int
    state: int
    state_name: str
    idle_ns: int
    exit_latency_ns: int
    wake_to_run_ns: int
    in_state_ns: int = 0


# ---------------------------------------------------------------------------------------
# malloc: allocator system calls (default) and allocator calls (uprobes, opt-in).


@event_kind("malloc.syscall")
@dataclass(frozen=True, slots=True)
class AllocSyscall(Event):
    dur_ns: int
    tid: int
    tgid: int
    cpu: int
    syscall: Literal["mmap", "munmap", "brk", "madvise", "mremap"]
    length: int  # bytes asked for (brk: the new break minus the old one when known, else 0)
    ret: int


@event_kind("malloc.call")
@dataclass(frozen=True, slots=True)
class AllocCall(Event):
    dur_ns: int
    tid: int
    tgid: int
    cpu: int
    func: str  # malloc, calloc, realloc, free, posix_memalign, aligned_alloc, ...
    allocator: str  # glibc, jemalloc, tcmalloc
    size: int


# ---------------------------------------------------------------------------------------
# python_gc: CPython cyclic-GC collections (USDT markers or uprobes on the collector).


@event_kind("python.gc")
@dataclass(frozen=True, slots=True)
class GcPause(Event):
    """Thread `tid` ran one collection of CPython's cyclic garbage collector from ts_ns for
    dur_ns (streamed when at least the probe's `pause` threshold). generation: 0-2 (-1: the
    build does not say); collected: objects it freed (-1 unknown; with the uprobe fallback,
    collected plus uncollectable)."""

    dur_ns: int
    tid: int
    tgid: int
    cpu: int
    generation: int
    collected: int = -1


@event_kind("python.sample")
@dataclass(frozen=True, slots=True)
class PySample(Event):
    """A stack sample of thread `tid` taken at ts_ns while it ran: its innermost Python frame,
    func in file where the function starts at `line`; where the thread had no Python frame,
    its native one (line NATIVE_LINE: func the symbol at its instruction address, file the
    module; native_frame says which). func "": neither could be read."""

    tid: int
    tgid: int
    func: str
    file: str
    line: int


# A frame at this line is native (a Python function starts at line 1 or later).
NATIVE_LINE = 0


def native_frame(func: str, line: int) -> bool:
    """Whether a sampled frame (func, line) is a native one, not a Python function's."""
    return bool(func) and line == NATIVE_LINE


# ---------------------------------------------------------------------------------------
# python_gil: waits to take CPython's GIL (uprobes on the interpreter's take_gil).


@event_kind("python.gil")
@dataclass(frozen=True, slots=True)
class GilWait(Event):
    """Thread `tid` waited from ts_ns for dur_ns to take its interpreter's GIL (streamed
    when at least the probe's `wait` threshold). holder_tid/holder_comm: the thread of its
    process that had taken the GIL last before it (0/"": none seen since the probe began)."""

    dur_ns: int
    tid: int
    tgid: int
    cpu: int
    holder_tid: int = 0
    holder_comm: str = ""


# ---------------------------------------------------------------------------------------
# GPU side: NVML samples and libcuda API calls.


@event_kind("gpu.sample")
@dataclass(frozen=True, slots=True)
class GpuSample(Event):
    """One NVML sample: the GPU's activity over [ts_ns, ts_ns + period_ns), ts_ns mapped
    onto CLOCK_MONOTONIC from NVML's timestamp (docs/gpu.md, "Clock calibration")."""

    gpu: int
    metric: Literal["util", "power"]
    value: float  # util: percent busy over the sample period; power: watts
    period_ns: int  # how long the sample covers (util 200 ms and power 20 ms on the H200)


@event_kind("gpu.clock")
@dataclass(frozen=True, slots=True)
class GpuClockMap(Event):
    """How GPU `gpu`'s NVML sample timestamps (µs on host clock `source`) are mapped onto
    CLOCK_MONOTONIC: mono_ns = ts_us * 1000 - offset_ns (offset_ns as read at ts_ns; it is
    re-read at every poll). lag_*: measured delay from a sample's timestamp to its read."""

    gpu: int
    source: str
    offset_ns: int
    lag_min_ns: int
    lag_median_ns: int
    lag_max_ns: int
    observations: int


@event_kind("gpu.procs")
@dataclass(frozen=True, slots=True)
class GpuProcesses(Event):
    """Compute processes of GPU `gpu` at ts_ns; sm_util: (pid, percent of the SM time it
    used) over the samples since the previous event, where NVML gives them."""

    gpu: int
    pids: tuple[int, ...]
    sm_util: tuple[tuple[int, int], ...] = ()


@event_kind("cuda.call")
@dataclass(frozen=True, slots=True)
class CudaCall(Event):
    """A libcuda API call of a watched process. Launches (and copies, graph launches) are
    reported as the first one after a quiet stretch: `after_idle_ns` since the process's
    previous activity, which was `prev_api` by thread `prev_tid` ("launch", "copy", "graph":
    work was enqueued then; "sync": a synchronisation returned then, so the queue it waited
    for had drained). Synchronisations are reported with their duration (time blocked) when
    they blocked long enough, or however short when they end a quiet stretch begun by
    enqueued work (schema 1.7); `after_idle_ns` and `prev_*` then describe the stretch
    before the sync's entry (0: unknown, e.g. another thread was inside a sync)."""

    dur_ns: int
    tid: int
    tgid: int
    cpu: int
    api: Literal["launch", "copy", "sync", "graph"]
    func: str
    after_idle_ns: int = 0
    prev_tid: int = 0
    prev_api: str = ""
