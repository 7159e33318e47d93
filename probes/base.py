"""What every probe is, and the bcc plumbing they share.

A Probe is started with a ProbeContext (topology, thresholds, where events go), polled for
its ring-buffer records, sampled once a second for its in-kernel aggregates, and asked for
its health. BpfProbe implements that for a probe backed by one `.bpf.c` file next to its
module: compile with -D options, open its ring buffers, count lost records.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes as ct
import errno
import functools
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from gpujitter.errors import GpujitterError
from gpujitter.probes import contract, procfs
from gpujitter.probes.events import Event, ProbeStatus
from gpujitter.probes.host import HostPaths, MemoryLimit
from gpujitter.probes.mapbatch import PerCpuSum
from gpujitter.probes.progstats import Cost, program_fds
from gpujitter.text import decode_name

if TYPE_CHECKING:
    from gpujitter.probes.bundle import Bundle, ModulePart
    from gpujitter.probes.log2 import Log2Map
    from gpujitter.probes.registry import ProbeSpec
    from gpujitter.probes.topology import Topology
    from gpujitter.probes.watch import CoreBpf

BPF_DIR = Path(__file__).with_name("bpf")
SHARED_HEADER = "gpujitter.h"
# Options every compile ends with. bcc (0.26, LLVM >= 9) compiles with -g -gdwarf-4 to load
# the programs' BTF beside them; nothing here needs BTF (no spin locks, task storage, timers
# or global subprograms), and making the debug info is ~15 % of the compile's CPU time
# (docs/performance.md, "Start and stop"). A later -g0 turns it off. What it costs: a
# verifier's refusal no longer quotes the source line.
COMPILE_FLAGS = ("-g0",)

# Called with each event; returns False when the consumer had to drop it (counted as lost).
Emit = Callable[[Event], bool | None]


class ProbeUnavailable(Exception):
    """The kernel refused this probe (missing hook, verifier, compile error): one line why."""


@dataclass(slots=True)
class ProbeContext:
    topology: Topology
    emit: Emit
    # Per-probe threshold overrides in ns: {"sched": {"offcpu": 1_000_000}}.
    thresholds: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # Per-probe options a probe understands (malloc's precise mode: {"malloc": {...}}).
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Objects the probes of one set share, by name: a BPF object that serves two registry
    # entries (faults and swap) lives here while either of them runs.
    shared: dict[str, Any] = field(default_factory=dict)
    # The one bcc module the set's probes were compiled into (probes/bundle.py), if any.
    bundle: Bundle | None = None

    def watched_set(self, need: str) -> CoreBpf:
        """The set's watched processes (the runner's core, shared as "core"), for a probe that
        needs them to `need` ("scan", "sample"): without the core it cannot start."""
        core = self.shared.get("core")
        if core is None:
            raise ProbeUnavailable(f"no watched set to {need} (the core module is not loaded)")
        return core


class Counted:
    """What a probe, and the core module (CORE_PROBE), say of themselves in their
    meta.probe: the events handed on, those the consumer refused, the kernel's losses and
    the BPF cost."""

    def __init__(self) -> None:
        self.events = 0
        self.lost_user = 0
        self.cost = Cost()  # set by the runner's CostMeter
        self._emit: Emit = lambda ev: True

    def lost_kernel(self) -> int:
        return 0

    def deliver(self, ev: Event) -> None:
        self.events += 1
        if self._emit(ev) is False:
            self.lost_user += 1

    def counted_status(self, now_ns: int, probe: str, state: str, reason: str) -> ProbeStatus:
        return ProbeStatus(
            ts_ns=now_ns,
            probe=probe,
            state=state,  # type: ignore[arg-type]
            reason=reason,
            events=self.events,
            lost_kernel=self.lost_kernel(),
            lost_user=self.lost_user,
            bpf_ns_per_s=self.cost.ns_per_s,
            bpf_runs_per_s=self.cost.runs_per_s,
            cost_from=self.cost.source,
        )


class Probe(Counted, abc.ABC):
    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__()
        self.spec = spec
        self.state: str = "off"
        self.reason = ""

    @property
    def name(self) -> str:
        return self.spec.name

    def threshold(self, ctx: ProbeContext, key: str) -> int:
        return threshold_ns(self.spec, ctx, key)

    def parts(self, ctx: ProbeContext) -> list[ModulePart]:
        """The .bpf.c parts this probe needs in the set's shared module (none by default)."""
        return []

    @abc.abstractmethod
    def start(self, ctx: ProbeContext) -> None:
        """Compile (or take its part of ctx.bundle) and attach; raise ProbeUnavailable when
        the kernel refuses."""

    def poll(self) -> None:
        """Deliver what the kernel has queued (every POLL_MS of probes/runner.py, or sooner
        when the kernel says a burst is filling the rings)."""

    def ring_fds(self) -> list[int]:
        """The fds of the ring buffers its poll drains: the runner waits on them for the
        kernel's early wake-up (gj_wake_flags in gpujitter.h; none by default)."""
        return []

    def due_ns(self) -> int | None:
        """When its poll has work due whatever its rings hold (monotonic ns; None: never),
        which the runner's wait does not outlast."""
        return None

    def sample(self, now_ns: int) -> Iterable[Event]:
        """Periodic aggregates read from kernel maps (called about once a second)."""
        return ()

    def log2_maps(self) -> Sequence[Log2Map]:
        """Its in-kernel log2 histograms, which the runner reads at its own, slower cadence
        (probes/runner.py HIST_EVERY_NS; none by default)."""
        return ()

    def programs(self) -> list[int]:
        """The fds of the BPF programs this probe runs, for its cost (none by default)."""
        return []

    def cost_counted_with(self) -> str:
        """The probe whose cost holds this one's programs, where they are shared and counted
        there ("" where the probe's cost is its own)."""
        return ""

    def close(self) -> None:
        """Detach and free kernel resources."""

    def status(self, now_ns: int) -> ProbeStatus:
        return self.counted_status(now_ns, self.name, self.state, self.reason)


_capture_lock = threading.RLock()  # a capture may hold another (an attach that compiles)


class _SideStream:
    """sys.stdout or sys.stderr while their fd is captured (captured_output): what Python
    code of any thread writes still goes where it went, through a copy of the fd; once the
    capture ends, to the stream itself (whoever took this object meanwhile, a console's
    writer thread say, keeps writing)."""

    def __init__(self, stream: TextIO, fd: int) -> None:
        self._stream = stream
        self._fd = fd  # the copy; -1 once the capture ended
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            if self._fd < 0:
                return self._stream.write(text)
            data = text.encode(self._stream.encoding or "utf-8", errors="replace")
            while data:
                data = data[os.write(self._fd, data) :]
            return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._fd < 0:
                self._stream.flush()

    def end(self) -> None:
        with self._lock:
            self._fd = -1

    def target_fd(self) -> int:
        """The fd it writes to now: the copy of the stream's own while the capture lasts."""
        with self._lock:
            return self._fd if self._fd >= 0 else self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _side_stream(stream: TextIO, fd: int, copy: int) -> _SideStream | None:
    """A _SideStream for `stream` where it writes to `fd`, else None (a test's capture, a
    replaced stream: the capture does not touch it)."""
    try:
        if stream.fileno() != fd:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    return _SideStream(stream, copy)


@contextlib.contextmanager
def captured_output() -> Iterator[Callable[[], str]]:
    """Capture fds 1 and 2 while bcc compiles: libbcc and clang print errors on stderr (a
    refused probe is then reported in one line, not a screenful of clang output) and notes
    such as "Unable to find kernel headers" on stdout, where they would corrupt the NDJSON
    of `gpujitter probe --json`. Only C code's output: Python's sys.stdout and sys.stderr
    write to copies of the fds meanwhile, so what another thread says during a compile of
    seconds (the daemon's notes, an error) is not swallowed. One capture at a time."""
    # In memory, not a file: a unit with no writable temporary folder (ProtectSystem
    # without PrivateTmp) made every compile an internal error.
    with (
        _capture_lock,
        os.fdopen(os.memfd_create("gpujitter-compile", os.MFD_CLOEXEC), "w+b") as tmp,
    ):
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        streams = (sys.stdout, sys.stderr)
        side = (_side_stream(sys.stdout, 1, saved[0]), _side_stream(sys.stderr, 2, saved[1]))
        sys.stdout, sys.stderr = (new or old for new, old in zip(side, streams, strict=True))
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lambda: _read(tmp)
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
            for stream in side:
                if stream is not None:
                    stream.end()
            for copy in saved:
                os.close(copy)
            if side[0] is not None and sys.stdout is side[0]:
                sys.stdout = streams[0]
            if side[1] is not None and sys.stderr is side[1]:
                sys.stderr = streams[1]


def open_files_needed() -> int:
    """The descriptors a daemon with every probe may take, with room for its clients (64)
    and files: 141 on the 2-CPU development VM, of which 57 maps, 33 programs, 23 links and
    10 perf events, 5 a CPU, which grow with the node."""
    return 192 + 6 * (os.cpu_count() or 1)


# An open that fails for want of a descriptor: this process's limit (EMFILE), the node's (ENFILE).
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


def out_of_descriptors(err: OSError) -> str:
    """What an EMFILE or ENFILE means, in one line: which limit, and what to raise."""
    what = f"{err.strerror}: {err.filename}" if err.filename is not None else err.strerror
    if err.errno == errno.ENFILE:
        return (
            f"out of file descriptors ({what}): the node's file table is full "
            "(/proc/sys/fs/file-nr): find what holds them, or raise fs.file-max"
        )
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (
        f"out of file descriptors ({what}): none is left under its open-file limit of {soft} "
        f"(ulimit -n, LimitNOFILE=); the probes may take {open_files_needed()} on this node, "
        "besides any it was started with: raise the limit (the unit sets 65536)"
    )


@contextlib.contextmanager
def descriptors_said() -> Iterator[None]:
    """EMFILE or ENFILE within the block raised as GpujitterError, out_of_descriptors' line:
    an environment's limit, said as one, not a fault of gpujitter's own."""
    try:
        yield
    except OSError as err:
        if err.errno not in OUT_OF_DESCRIPTORS:
            raise
        raise GpujitterError(out_of_descriptors(err)) from None


# The memory a start wants room for: its peak, the probes' compile, was 144-173 MB on an H100
# host once NVML waited for it (197-199 MB on the H200 with NVML beside it; docs/performance.md,
# "Start and stop"), and a steady daemon holds ~130 MB. Under a cgroup limit below it, a start
# thrashed past its --duration (a 60 MB memory.high) or would be killed (memory.max).
START_MEMORY_BYTES = 256 << 20


def memory_short(limit: MemoryLimit | None) -> str | None:
    """What a memory cgroup limit below START_MEMORY_BYTES means, in one line (None when
    there is no such limit)."""
    if limit is None or limit.bytes >= START_MEMORY_BYTES:
        return None
    fate = "thrashes" if limit.setting == "memory.high" else "thrashes or is killed"
    return (
        f"{limit.setting} {limit.bytes >> 20} MiB ({limit.path.parent}): a start peaks at "
        f"~180 MiB resident (the probes' compile), a running daemon holds ~130 MiB; under "
        f"it the start {fate}"
    )


def compile_blocked() -> str | None:
    """Why bcc cannot compile in this process, where its own failure would not say (None
    when nothing is known against it). Its loader asks for the current folder, and gave a
    bare "Failed to compile BPF module" where that was deleted; short of descriptors,
    libbcc crashed (SIGSEGV) mid-compile. The soft open-file limit is raised to the hard
    one first (most shells and units leave it at 1024 under a far higher ceiling)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return (
            "the current folder was deleted, and bcc's compiler needs one: start from one "
            "that exists"
        )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = descriptors_open(soft)
    need = open_files_needed() + max(0, held - HELD_AT_COMPILE)
    if soft < need and soft != resource.RLIM_INFINITY:
        want = need if hard == resource.RLIM_INFINITY else min(hard, max(need, 65536))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    if soft < need:
        already = f", with {held} descriptors open already" if held > HELD_AT_COMPILE else ""
        return (
            f"open-file limit {soft} (ulimit -n, LimitNOFILE=) is below the {need} the "
            f"probes may take on this node{already}"
        )
    return None


# The descriptors a start may hold itself when it compiles, which open_files_needed counts:
# the standard streams, Python's, and the files of a compile begun ahead on another thread
# (4 to 13 for `run` on the development VM, as those come and go). Past them, what the
# process holds counts against its limit too: a start passed 150 descriptors by what started
# it (a supervisor that leaks its own), under a limit of 204, crashed libbcc (SIGSEGV).
HELD_AT_COMPILE = 16


def descriptors_open(limit: int) -> int:
    """How many descriptors this process holds: all of `limit` where none is left to count
    them with, 0 where /proc cannot tell."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one that lists them
    except OSError as err:
        return limit if err.errno in OUT_OF_DESCRIPTORS else 0


def bpf_source(path: Path) -> str:
    """The .bpf.c text with gpujitter.h pasted in place of its #include, the constants it
    shares with user space (probes/contract.py) defined ahead of it. bcc rewrites map calls
    (`m.lookup(&k)`) only in the main file, so the header's inline helpers must be part of
    it; #line directives keep compiler messages pointing at the real files."""
    header = BPF_DIR / SHARED_HEADER
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip() == f'#include "{SHARED_HEADER}"':
            out += [*contract.header_lines(), f'#line 1 "{header}"', header.read_text()]
            out.append(f'#line {lineno + 1} "{path}"')
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _read(tmp: Any) -> str:
    tmp.seek(0)
    return str(tmp.read().decode(errors="replace"))


def first_error_line(text: str, fallback: str) -> str:
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()
    return fallback


# The compiler bcc loads (its libclang and LLVM, statically or as libraries): ~85 MB of their
# code stays resident after a compile, read once and not again until the next compile.
COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc")
MADV_PAGEOUT = 21  # linux/mman.h, since 5.4


def compiler_code(maps: list[procfs.Mapping]) -> list[tuple[int, int]]:
    """(start, length) of the read-only mappings of the compiler's files among a process's
    mappings: what can be handed back without a write (writable ones would need swap)."""
    return [
        (m.start, m.size)
        for m in maps
        if not m.writable and os.path.basename(m.path).startswith(COMPILER_LIBRARIES)
    ]


def trim_heap() -> None:
    """Hand the heap that glibc keeps free (after a large transient, like a compile's or a
    big symbol table's sort) back to the system. Best effort: a C library without
    malloc_trim keeps it."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def release_compiler_memory() -> None:
    """Hand back to the system what bcc's compiles left resident: the heap LLVM freed (it stays
    in glibc's arenas, ~40 MB) and the compiler's code, which nothing runs between compiles
    (MADV_PAGEOUT: dropped from this process, read from the file again if a compile needs it;
    pages another process maps stay). Best effort: a C library without malloc_trim or a
    kernel without MADV_PAGEOUT keeps them (docs/performance.md)."""
    import ctypes

    libc = ctypes.CDLL(None)
    trim_heap()
    try:
        maps = procfs.read_maps(HostPaths(), "self")
    except OSError:
        return
    for start, length in compiler_code(maps):
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_PAGEOUT)


def threshold_ns(spec: ProbeSpec, ctx: ProbeContext, key: str) -> int:
    """A threshold of `spec`: the context's override, else the registry default."""
    return int(ctx.thresholds.get(spec.name, {}).get(key, spec.thresholds[key]))


def threshold_cflags(spec: ProbeSpec, ctx: ProbeContext) -> list[str]:
    """-D options: every threshold of `spec` as THRESHOLD_<KEY>_NS."""
    return [
        f"-DTHRESHOLD_{key.upper()}_NS={threshold_ns(spec, ctx, key)}ULL" for key in spec.thresholds
    ]


# How long one drain of the rings (ProbeSet.poll: every ring of the set's module) may go on
# before it hands the probe thread back to its loop. libbpf's consume reads a ring until it
# finds it empty: where records come faster than this thread takes them (a job churning
# thousands of threads a second on a saturated node, this thread given a sliver of a CPU)
# it never did, and the loop's ticks, statuses and stop waited behind it (`gpujitter record
# -d 110s` beside such a job ran on for over 15 minutes). What a cut drain leaves stays in
# the ring for the next one; what the ring cannot hold meanwhile the kernel counts as lost.
DRAIN_SLICE_NS = 100_000_000
_CHECK_EVERY = 64  # records a ring's callback hands on between two reads of the clock


class _Drain(threading.local):
    """The drain under way on this thread: its deadline (0: none, a consume outside a
    ProbeSet's poll reads to the end) and whether a callback found it passed."""

    deadline_ns = 0
    cut = False


_DRAIN = _Drain()


class DrainSlice:
    """One drain of the rings within `slice_ns`; `cut` says, after it, whether the slice ran
    out with records left."""

    def __init__(self, slice_ns: int) -> None:
        self.slice_ns = slice_ns
        self.cut = False

    def __enter__(self) -> DrainSlice:
        _DRAIN.deadline_ns = time.monotonic_ns() + self.slice_ns
        _DRAIN.cut = False
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut = _DRAIN.cut
        _DRAIN.deadline_ns, _DRAIN.cut = 0, False


class SliceCheck:
    """What a ring's callback returns once it has handed its record on: -1 once the drain's
    slice is spent (libbpf's consume then ends, that record consumed), else 0. The clock is
    read every _CHECK_EVERY records of the ring; once cut, every record ends the consume (the
    set's other probes consume the same module in the same drain)."""

    __slots__ = ("_left",)

    def __init__(self) -> None:
        self._left = _CHECK_EVERY

    def __call__(self) -> int:
        self._left -= 1
        if self._left > 0:
            return 0
        self._left = _CHECK_EVERY
        d = _DRAIN
        if d.cut or (d.deadline_ns and time.monotonic_ns() >= d.deadline_ns):
            d.cut = True
            self._left = 1
            return -1
        return 0


def consume_rings(bpf: Any) -> None:
    """Deliver the records bpf's ring buffers hold (bcc's ring_buffer_consume; all of them
    unless the drain's slice ends first: SliceCheck), the GIL held throughout. bcc calls
    libbcc as a CDLL, which lets the GIL go for the call, so each record's callback had to
    take it back: beside a busy thread (the daemon's analysis) every record waited its
    turn, 1.75-2.35 µs of this thread's CPU a record against 0.44-0.50 µs held
    (bench/ring_gil.py; docs/performance.md). libbpf's consume never blocks, and the
    callbacks are Python: nothing could have run beside them."""
    manager = bpf._ringbuf_manager  # bcc's libbpf ring_buffer, one per module
    if manager:
        _consume_holding_gil()(manager)


@functools.cache
def _consume_holding_gil() -> Callable[[int], int]:
    from bcc.libbcc import lib  # imported here: the registry must load without bcc

    fn = ct.PyDLL(lib._name).bpf_consume_ringbuf
    fn.argtypes, fn.restype = [ct.c_void_p], ct.c_int
    return fn


def compile_bpf(source: Path, cflags: list[str], attach: Callable[[Any], None]) -> Any:
    """Compile `source` with gpujitter.h pasted in, then `attach(bpf)` the hooks bcc does not
    attach by itself. Either failing raises ProbeUnavailable with the first error line (not
    a screenful of clang output) and frees what was loaded."""
    from bcc import BPF  # imported here: the registry must load on nodes without bcc

    if (why := compile_blocked()) is not None:
        raise ProbeUnavailable(why)
    bpf = None
    with captured_output() as err:
        try:
            bpf = BPF(text=bpf_source(source).encode(), cflags=[*cflags, *COMPILE_FLAGS])
            attach(bpf)
        except Exception as exc:
            if bpf is not None:
                bpf.cleanup()
            raise ProbeUnavailable(first_error_line(err(), str(exc))) from None
    return bpf


class BpfProbe(Probe):
    """A probe backed by `<module>.bpf.c`, compiled by bcc with gpujitter.h pasted in (as a
    part of the set's one module, probes/bundle.py).
    Subclasses name their ring buffers in `rings` and turn records into events in `decode`;
    tracepoints attach themselves (TRACEPOINT_PROBE), other hooks in `attach`."""

    bpf_file: ClassVar[str]  # its .bpf.c, beside this module
    rings: ClassVar[tuple[str, ...]] = ()
    # Constants the .bpf.c shares with the module (C never restates them): -D options.
    constants: ClassVar[Mapping[str, int]] = {}

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.bpf: Any = None
        self._lost: tuple[Any, PerCpuSum] | None = None  # (bpf, its gj_lost), per status

    def cflags(self, ctx: ProbeContext) -> list[str]:
        """-D options: every threshold as THRESHOLD_<KEY>_NS, the constants shared with the
        .bpf.c, plus what subclasses add."""
        return threshold_cflags(self.spec, ctx) + contract.cflags(self.constants)

    def attach(self, ctx: ProbeContext) -> None:
        """Attach hooks that bcc does not attach by itself (perf events, uprobes)."""

    @abc.abstractmethod
    def decode(self, ring: str, rec: Any) -> Event | None:
        """Turn one ring-buffer record (bcc's ctypes view) into an event, or None to skip."""

    def carried(self, bundle: Bundle) -> frozenset[str]:
        """Raw tracepoints of its part that it leaves unattached in `bundle`, the module it
        landed in, because another part's programs there run its share of them (none by
        default; probes/bundle.py)."""
        return frozenset()

    def parts(self, ctx: ProbeContext) -> list[ModulePart]:
        from gpujitter.probes.bundle import ModulePart  # bundle.py builds on this module

        return [
            ModulePart(self.name, Path(__file__).with_name(self.bpf_file), tuple(self.cflags(ctx)))
        ]

    def start(self, ctx: ProbeContext) -> None:
        from gpujitter.probes.bundle import load_part

        self._emit = ctx.emit

        def attach(bpf: Any) -> None:
            self.bpf = bpf
            self.attach(ctx)

        try:
            load_part(ctx, self.parts(ctx)[0], attach, self.carried)
        except ProbeUnavailable:
            self.bpf = None
            raise
        for ring in self.rings:
            self.bpf[ring].open_ring_buffer(self._callback(ring))
        self.state = "running"

    def _callback(self, ring: str) -> Callable[[Any, int, int], int]:
        table = self.bpf[ring]
        record: Any = None  # the ring's record struct, known from its first record
        drained = SliceCheck()

        def on_record(_ctx: Any, data: int, _size: int) -> int:
            nonlocal record
            if self.bpf is None:  # closed: its module may live on (the core's, watch.py)
                return 0
            if record is None:
                record = type(table.event(data))
            # The same view of the record as bcc's table.event (a cast of the pointer, 1.7 µs
            # a record), made from its address (0.2 µs).
            ev = self.decode(ring, record.from_address(data))
            if ev is not None:
                self.deliver(ev)
            return drained()

        return on_record

    def poll(self) -> None:
        if self.bpf is not None and self.rings:
            self.bpf.ring_buffer_consume()

    def ring_fds(self) -> list[int]:
        return [self.bpf[ring].map_fd for ring in self.rings] if self.bpf is not None else []

    def lost_kernel(self) -> int:
        if self.bpf is None:
            return 0
        if self._lost is None or self._lost[0] is not self.bpf:
            self._lost = (self.bpf, PerCpuSum(self.bpf["gj_lost"]))
        return self._lost[1].read()

    def programs(self) -> list[int]:
        return program_fds(self.bpf)

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
        self._lost = None
        if self.state == "running":
            self.state = "stopped"


_NAMES: dict[bytes, str] = {}  # comm bytes -> its text, one string object per name
_NAMES_MAX = 4096


def comm_str(raw: bytes) -> str:
    """A kernel comm/char array as text (NUL-terminated, not always valid UTF-8), decoded
    without loss (gpujitter.text.decode_name): names differing in one byte stay different.
    One string per name: the events the engine keeps for its minute of history name a few
    hundred tasks, and each decoded anew held its own copy (138k strings, 7 MB, beside a job
    churning ~2,800 threads a second). Emptied whole when full (a crowd of distinct names)."""
    name = _NAMES.get(raw)
    if name is None:
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        name = _NAMES[raw] = decode_name(raw)
    return name
