"""The watched set: which processes the probes follow, and the core BPF module that holds it.

Processes are chosen by PID, by command-name pattern (fnmatch, on comm and on the program's
basename), by cgroup (v1 or v2 directory: its cgroup.procs and those below it), by Kubernetes
pod or Slurm job (their processes' cgroup paths, probes/workload.py), and "every process using
a GPU" (a callable the GPU side supplies). The set is resolved to process ids in user space and
written into one kernel map that every probe filters on; the kernel itself adds children of
watched processes as they fork and drops processes as they exit, so threads and workers
created after start are watched from their first instruction. Each process that joins the set
inside a container, pod or Slurm job is announced once with its workload (meta.workload).
The core reports its own health and BPF cost as a probe's, named CORE_PROBE ("core").
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import fnmatch
import functools
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpujitter.probes import contract
from gpujitter.probes.base import (
    OUT_OF_DESCRIPTORS,
    Counted,
    ProbeUnavailable,
    SliceCheck,
    comm_str,
)
from gpujitter.probes.bundle import Bundle, ModulePart, PartView
from gpujitter.probes.contract import CFG_FLAGS, CFG_GEN, CFG_SELF_TGID, WATCH_ALL
from gpujitter.probes.events import (
    CORE_PROBE,
    Event,
    ProbeStatus,
    ProcExec,
    ProcExit,
    ThreadExit,
    WatchChange,
    WorkloadInfo,
)
from gpujitter.probes.host import HostPaths, listed_pids, parse_status, read_file, read_name
from gpujitter.probes.mapbatch import PerCpuSum
from gpujitter.probes.procfs import (
    is_kernel_thread,
    listed_task_ids,
    process_start,
    read_process_start,
    read_while_alive,
)
from gpujitter.probes.progstats import program_fds
from gpujitter.probes.registry import TRACEFS
from gpujitter.probes.topology import Topology
from gpujitter.probes.workload import WorkloadReader, matches_pod, matches_slurm_job
from gpujitter.text import decode_name

# Why a process is in the kernel map (the map's value, bits).
WHY_PID, WHY_COMM, WHY_CGROUP, WHY_GPU, WHY_FORK = 0x01, 0x02, 0x04, 0x08, 0x80
# A process the spec chooses has its children walked at this many refreshes (CoreBpf._walks).
ROOT_WALKS = 2
EXEC, EXIT_PROCESS, EXIT_THREAD = 0, 1, 2  # proc_event.exited
# Exits the core keeps for the probes that read them at their tick (ExitLog): a reader that
# more exits passed since its last read walks its maps instead. About where the two cost the
# same: an exit's deletes took cuda and python_gc 4-5 us each (bcc's map calls), a walk
# 0.15-0.35 ms (dev VM, a watched process starting 50 and 200 threads a second).
EXITS_KEPT = 32
# How often a reader walks its maps all the same: entries of the exits no record told of
# (a record lost, counted; a process no longer watched when it ended).
WALK_EVERY_NS = 10_000_000_000


def _exit_tells_group_dead() -> bool:
    """Whether this kernel's sched_process_exit says when a thread group's last thread goes
    (its `group_dead` field, since 6.16): without it the leader's exit is taken for the
    process's, which a leader that goes first (another thread's exec, pthread_exit) is not."""
    try:
        return "group_dead;" in (TRACEFS / "events/sched/sched_process_exit/format").read_text()
    except OSError:
        return False


# What watch.bpf.c gets as -D options.
CONSTANTS = {
    "GJ_WHY_FORK": WHY_FORK,
    "GJ_EXEC": EXEC,
    "GJ_EXIT_PROCESS": EXIT_PROCESS,
    "GJ_EXIT_THREAD": EXIT_THREAD,
    "GJ_GROUP_DEAD": int(_exit_tells_group_dead()),
}


@dataclass(slots=True)
class WatchSpec:
    pids: set[int] = field(default_factory=set)
    comms: list[str] = field(default_factory=list)  # fnmatch patterns
    cgroups: list[Path] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)  # NAME or NAMESPACE/NAME
    slurm_jobs: list[str] = field(default_factory=list)  # job ids
    gpu_processes: Callable[[], Iterable[int]] | None = None
    all: bool = False  # every process (system-wide view); thresholds keep the rate sane

    def selects_any(self) -> bool:
        """Does the spec name any process by itself (pid, comm, cgroup)?"""
        return bool(self.pids or self.comms or self.cgroups or self.pods or self.slurm_jobs)

    def describe(self) -> str:
        if self.all:
            return "all processes"
        parts = [f"pid {p}" for p in sorted(self.pids)]
        parts += [f"comm {c}" for c in self.comms]
        parts += [f"cgroup {c}" for c in self.cgroups]
        parts += [f"pod {p}" for p in self.pods]
        parts += [f"slurm job {j}" for j in self.slurm_jobs]
        if self.gpu_processes is not None:
            parts.append("GPU processes")
        return ", ".join(parts) or "nothing"

    def unwatchable(self, paths: HostPaths) -> list[str]:
        """Each pid given that watches nothing, in one line: a mistyped or stale id, or a
        kernel thread's (`-p 2`), which launches no GPU work, so that no gap can be its. Said
        at the start rather than left to an empty log."""
        said = []
        for pid in sorted(self.pids):
            if process_start(paths, pid, zombie=False) is None:
                said.append(f"watch: pid {pid}: no such process")
            elif is_kernel_thread(paths, pid):
                comm = read_name(paths.proc / str(pid) / "comm") or "?"
                said.append(f"watch: pid {pid}: a kernel thread ({comm}), not a GPU process: "
                            "nothing can be attributed to it")  # fmt: skip
        return said


_T = TypeVar("_T")

# What fails every read of /proc alike, not one process's: the whole set is then kept.
SHORTAGE = OUT_OF_DESCRIPTORS | {errno.ENOMEM}

# What reading a cgroup's directory or its cgroup.procs fails with once the cgroup is
# removed (ENODEV: while it dies); a threaded cgroup's cgroup.procs cannot be read (EOPNOTSUPP).
CGROUP_GONE = frozenset({errno.ENOENT, errno.ENODEV})
THREADED = errno.EOPNOTSUPP


def cgroup_members(cgroup: Path) -> list[int]:
    """Every process in cgroup directory `cgroup` and the cgroups below it: on cgroup v2 a
    job's, a pod's or a slice's own cgroup holds none itself once it has controllers, its
    processes are in its children. A threaded cgroup's cgroup.procs cannot be read
    (EOPNOTSUPP): its processes are its domain parent's. OSError where a directory or a
    cgroup.procs cannot be read for another reason than the cgroup's removal (out of file
    descriptors, EACCES, EIO): its processes are not known to have left, and the walk had
    taken them for none (os.walk passes over what it cannot list)."""

    def unlisted(err: OSError) -> None:
        if err.errno not in CGROUP_GONE:
            raise err

    out: list[int] = []
    for root, _, _ in os.walk(cgroup, onerror=unlisted):
        try:
            out += [int(pid) for pid in read_file(Path(root) / "cgroup.procs").split()]
        except OSError as err:
            if err.errno not in CGROUP_GONE and err.errno != THREADED:
                raise
    return out


def command_names(paths: HostPaths, tgid: int) -> set[str] | None:
    """What --comm patterns match of a process: its name (comm) and its program's base name
    (cmdline's first word, any bytes it chose: a name that is not UTF-8 still matches by the
    rest). None once it has ended; OSError where either cannot be read for another reason
    (read_while_alive), which is no name: the watch took it for one that matches nothing."""
    comm = read_while_alive(paths.proc / str(tgid) / "comm")
    cmdline = read_while_alive(paths.proc / str(tgid) / "cmdline")
    if comm is None or cmdline is None:
        return None
    names = {decode_name(comm.removesuffix(b"\n"))}
    if cmdline:
        names.add(os.path.basename(cmdline.decode(errors="replace").split("\0", 1)[0]))
    return names - {""}


def resolve(
    spec: WatchSpec,
    paths: HostPaths,
    workloads: WorkloadReader | None = None,
    walked: Callable[[int], bool] = lambda tgid: False,
    pinned: dict[int, int | None] | None = None,
    undecided: dict[int, OSError] | None = None,
) -> dict[int, int]:
    """tgid -> why-bits for the processes the spec selects right now (a pod's or a Slurm
    job's processes are selected by their cgroup, so they carry the cgroup bit), with their
    children. `walked(tgid)`: that process's children need no walk (the caller's fork hook
    has followed them since an earlier walk). `pinned`: each of the spec's pids -> the start
    time of the process it named when first resolved (None: none ran), kept by the caller
    from one resolve to the next: a pid names that process only, never one that took its
    id after it exited. OSError where /proc or a cgroup cannot be read for another reason
    than a process's end or a cgroup's removal (the daemon out of file descriptors): then
    nothing it says is known to have ended, and the caller keeps what it watches; a cgroup's
    failure names the cgroup's directory as its file. `undecided`: where given, a process
    whose name or cgroup file fails it alone (EACCES from a security module, EIO) is put
    there instead, and the rest resolved: the --comm and --pod scans read every process of
    the node, and one such process would otherwise hold the whole set still for as long as
    it runs; a shortage of descriptors or memory (SHORTAGE) fails every read, and is raised."""
    chosen: dict[int, int] = {}
    pinned = {} if pinned is None else pinned

    def add(tgid: int, why: int) -> None:
        chosen[tgid] = chosen.get(tgid, 0) | why

    def per_process(read: Callable[[int], _T], tgid: int) -> _T | None:
        try:
            return read(tgid)
        except OSError as err:
            if undecided is None or err.errno in SHORTAGE:
                raise
            undecided[tgid] = err
            return None

    for pid in spec.pids:
        start = read_process_start(paths, pid, zombie=False)
        if start is not None and pinned.setdefault(pid, start) == start:
            add(pid, WHY_PID)
        pinned.setdefault(pid, None)
    if spec.comms:
        for tgid in listed_pids(paths):
            names = per_process(functools.partial(command_names, paths), tgid) or set()
            if any(fnmatch.fnmatchcase(n, pat) for n in names for pat in spec.comms):
                add(tgid, WHY_COMM)
    for cgroup in spec.cgroups:
        try:
            members = cgroup_members(Path(cgroup))
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(cgroup)) from err
        for tgid in members:
            add(tgid, WHY_CGROUP)
    if spec.pods or spec.slurm_jobs:
        reader = workloads or WorkloadReader(paths)
        for tgid in listed_pids(paths):
            w = per_process(reader.read, tgid)
            if w is not None and (
                any(matches_pod(w, p) for p in spec.pods)
                or any(matches_slurm_job(w, j) for j in spec.slurm_jobs)
            ):
                add(tgid, WHY_CGROUP)
    if spec.gpu_processes is not None:
        for pid in spec.gpu_processes():
            add(int(pid), WHY_GPU)
    # Children are followed from their first instruction once a process is watched (the
    # fork hook); those it had before (a job met already running: its DataLoader workers)
    # are found here, or the chain from the training thread to a busy worker breaks.
    # Not below init or kthreadd: their children are every service and kernel thread.
    for tgid in _descendants(paths, [t for t in chosen if t > 2 and not walked(t)]):
        add(tgid, WHY_FORK)
    return chosen


def _descendants(paths: HostPaths, roots: list[int]) -> set[int]:
    """The processes below `roots` (from /proc/PID/task/TID/children); OSError where a
    process's threads or children cannot be read for another reason than its end: a walk
    that found none there would be counted as done (CoreBpf._walks), its children never
    looked for again."""
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        task = f"{paths.proc}/{pid}/task"
        for tid in listed_task_ids(paths, pid):  # none when gone
            for child in (read_while_alive(f"{task}/{tid}/children") or b"").decode().split():
                if child.isdigit() and int(child) not in found:
                    found.add(int(child))
                    todo.append(int(child))
    return found - set(roots)


# The core's part of a module: first in it (gpujitter.h then defines the shared maps, exported
# to the process, where later modules declare them extern), and never left out of it.
CORE_PART = ModulePart(
    "watch",
    Path(__file__).with_name("watch.bpf.c"),
    tuple(contract.cflags(CONSTANTS)),
    essential=True,
)


class _LoadedCore:
    """watch.bpf.c, compiled once and kept for the life of the process, as the first part of
    the first probe set's module (one compile, not two: docs/performance.md). libbcc keeps
    the tables a module exports in one registry per process, by name: a destroyed module
    leaves its entries behind (descriptors closed) and a later export of the same name does
    not replace them, so probes compiled after a second core would refer to dead maps (the
    kernel then refuses them). The core's view therefore never lets the module go; the first
    set's probes detach from it as they stop, and later sets compile modules of their own.
    Probe sets borrow the core one at a time; between loans its tracepoints are detached and
    the watched set is empty, so an idle core costs nothing."""

    def __init__(self, view: PartView) -> None:
        self.bpf = view
        self.attached = False
        self.owner: CoreBpf | None = None
        self._drained = SliceCheck()
        self.bpf["proc_events"].open_ring_buffer(self._on_proc)

    def _on_proc(self, ctx: Any, data: int, size: int) -> int:
        if self.owner is not None:  # what a finished borrower left unread goes nowhere
            self.owner.on_proc(self.bpf["proc_events"].event(data))
        return self._drained()

    def lend(self, owner: CoreBpf) -> PartView:
        if not self.attached:
            self.bpf.attach_hooks()
            self.attached = True
        self.owner = owner
        return self.bpf

    def give_back(self, owner: CoreBpf) -> None:
        if self.owner is not owner:
            return
        self.bpf.detach()
        self.attached = False
        self.owner = None
        self.bpf.ring_buffer_consume()
        self.bpf["gj_watched"].clear()
        self.bpf["gj_config"][ct.c_uint(CFG_FLAGS)] = ct.c_ulonglong(0)
        watched_changed(self.bpf)


_core: _LoadedCore | None = None
_core_lock = threading.Lock()


def module_parts(parts: Sequence[ModulePart]) -> list[ModulePart]:
    """What the module of a probe set holds: its probes' parts, after the core's where the
    process has no core loaded yet."""
    return list(parts) if _core is not None else [CORE_PART, *parts]


class ExitLog:
    """The exits of watched threads and processes as the core streamed them: a count, and the
    latest EXITS_KEPT (tgid, tid), for the probes that keep entries per thread or process in
    their maps. Each deletes the ids of the exits since its last read (ExitReader), where a
    walk of its maps would find them: every bucket of a hash sized for 64k threads, then /proc
    for each key, 0.5 ms a tick for the cuda probe alone on an H100 host."""

    def __init__(self, kept: int = EXITS_KEPT) -> None:
        self.count = 0
        self._kept: deque[tuple[int, int]] = deque(maxlen=kept)

    def add(self, tgid: int, tid: int) -> None:
        self.count += 1
        self._kept.append((tgid, tid))

    def since(self, count: int) -> list[tuple[int, int]] | None:
        """The exits after the first `count`, oldest first; None where some of them are no
        longer kept."""
        new = self.count - count
        if new > len(self._kept):
            return None
        return list(itertools.islice(self._kept, len(self._kept) - new, None))


class ExitReader:
    """One probe's reading of its core's exits, tick by tick (probes keep no other record of
    which of their threads and processes ended)."""

    def __init__(self, core: CoreBpf, walk_every_ns: int = WALK_EVERY_NS) -> None:
        self._core = core
        self._read = core.exits.count
        self._walk_every_ns = walk_every_ns
        self._walked_ns: int | None = None

    def take(self, now_ns: int) -> list[tuple[int, int]] | None:
        """The (tgid, tid) of the exits since the last take; None when the probe is to walk
        its maps instead: at the first take, where the core streams no exits (every process
        watched), where more came than it keeps, and every walk_every_ns."""
        new = None
        if self._walked_ns is not None and now_ns - self._walked_ns < self._walk_every_ns:
            new = self._core.exits_since(self._read)
        self._read = self._core.exits.count
        if new is None:
            self._walked_ns = now_ns
        return new


class CoreBpf(Counted):
    """The core module as one probe set uses it: the shared maps (exported to every probe
    loaded after it in this process) and the exec/exit stream. Everything else depends on
    it, so a failure here is fatal to profiling, and is reported as such."""

    def __init__(self, spec: WatchSpec, topology: Topology, paths: HostPaths) -> None:
        super().__init__()
        self.spec = spec
        self.topology = topology
        self.paths = paths
        self.bpf: Any = None
        self._pending: Any = None  # gj_pending, zeroed at each drain
        self.watched: dict[int, int] = {}
        # Processes chosen by the spec -> the refreshes that walked their children. The
        # walk reads every thread's children file (~100 a second for one training process,
        # 0.6 ms of CPU on the H200): it finds what a process had before it was watched,
        # and what it forked while its entry was on its way to the kernel (the second
        # walk); from then on the fork hook follows its children.
        self._walks: dict[int, int] = {}
        self._processes: set[int] = set()  # fork-followed entries known to be processes
        self._pinned: dict[int, int | None] = {}  # the spec's pids -> their process's start
        self.workloads = WorkloadReader(paths)
        self._announced: set[int] = set()  # tgids whose workload was looked up
        # Its ring's losses since this set's start (gj_lost, its count then), in its
        # meta.probe (CORE_PROBE) as a probe's.
        self._lost: tuple[PerCpuSum, int] | None = None
        self.exits = ExitLog()  # written by on_proc, read by the probes' ExitReaders
        # Why the last refresh could not read /proc ("" when it could), in its status.
        self.unreadable = ""

    def start(
        self, emit: Callable[[Event], Any], parts: Sequence[ModulePart] = ()
    ) -> Bundle | None:
        """Borrow the process's core and compile the set's probe `parts` as one module,
        which the core's part joins where the process has no core yet. Returns that module
        (None without parts); raises ProbeUnavailable when the core cannot load."""
        global _core
        self._emit = emit
        with _core_lock:
            if _core is not None and _core.owner is not None:  # before seconds of compiling
                raise ProbeUnavailable("another probe set is already running in this process")
            bundle = Bundle(parts) if parts and _core is not None else None
            if _core is None:
                first = Bundle(module_parts(parts))
                try:
                    _core = _LoadedCore(first.view(CORE_PART.name))
                except ProbeUnavailable:
                    first.release()
                    raise
                if parts:
                    bundle = first
                else:  # the core's view holds it
                    first.release()
            try:
                self.bpf = _core.lend(self)
            except ProbeUnavailable:
                if bundle is not None:
                    bundle.release()
                raise
        self._pending = self.bpf["gj_pending"]
        lost = PerCpuSum(self.bpf["gj_lost"])  # the core outlives probe sets: from now on
        self._lost = (lost, lost.read())
        config = self.bpf["gj_config"]
        config[ct.c_uint(CFG_FLAGS)] = ct.c_ulonglong(WATCH_ALL if self.spec.all else 0)
        config[ct.c_uint(CFG_SELF_TGID)] = ct.c_ulonglong(os.getpid())
        watched_changed(self.bpf)
        cpu_node = self.bpf["gj_cpu_node"]
        for cpu, node in self.topology.cpu_node.items():
            cpu_node[ct.c_uint(cpu)] = ct.c_uint(node)
        self.refresh(now_ns=time.monotonic_ns())
        return bundle

    def watched_pids(self) -> list[int] | None:
        """The watched processes (None: every process), as of the last refresh or process
        event: the probes that attach per mapped file ask at each tick, right after the
        refresh that read the kernel's set (a read of that map each was ~0.1 ms)."""
        return None if self.spec.all else list(self.watched)

    def exits_since(self, count: int) -> list[tuple[int, int]] | None:
        """The exits streamed after the first `count` (ExitLog.since); None where the kernel
        streams none: with every process watched, exits are not filtered to stream."""
        return None if self.spec.all else self.exits.since(count)

    def programs(self) -> list[int]:
        """The fds of its BPF programs (fork, exec, exit), for its cost: its part's alone,
        none of the probes' that share its module."""
        return program_fds(self.bpf)

    def lost_kernel(self) -> int:
        return 0 if self._lost is None else self._lost[0].read() - self._lost[1]

    def status(self, now_ns: int) -> ProbeStatus:
        """Its health and cost, as a probe's: degraded while /proc cannot be read."""
        state = "stopped" if self.bpf is None else "degraded" if self.unreadable else "running"
        return self.counted_status(now_ns, CORE_PROBE, state, self.unreadable)

    def on_proc(self, rec: Any) -> None:
        comm = comm_str(rec.comm)
        if rec.exited == EXIT_PROCESS:  # its readers take (tgid, tgid) for the process's end
            if rec.tid != rec.tgid:  # the last thread of a group whose leader went first
                self.exits.add(rec.tgid, rec.tid)
            self.exits.add(rec.tgid, rec.tgid)
        elif rec.exited == EXIT_THREAD and rec.tid != rec.tgid:  # a leader's, not the process's
            self.exits.add(rec.tgid, rec.tid)
        if rec.exited == EXIT_THREAD:
            self.deliver(ThreadExit(ts_ns=rec.ts_ns, tgid=rec.tgid, tid=rec.tid))
            return
        if rec.exited == EXIT_PROCESS:
            self.deliver(ProcExit(ts_ns=rec.ts_ns, tgid=rec.tgid, comm=comm))
            self._processes.discard(rec.tgid)
            if self.watched.pop(rec.tgid, None) is not None:
                # Said as a change of the watched set too: its readers see the removal.
                self.deliver(WatchChange(ts_ns=rec.ts_ns, added=(), removed=(rec.tgid,),
                                          reason="exit"))  # fmt: skip
            return
        filename = comm_str(rec.filename)
        self.deliver(ProcExec(ts_ns=rec.ts_ns, tgid=rec.tgid, comm=comm, filename=filename))
        if self.spec.comms and any(
            fnmatch.fnmatchcase(n, p)
            for n in (comm, os.path.basename(filename))
            for p in self.spec.comms
        ):
            why = self.watched.get(rec.tgid, 0) | WHY_COMM
            self._set({**self.watched, rec.tgid: why}, rec.ts_ns, "exec")

    def poll(self) -> None:
        if self.bpf is not None:
            self.bpf.ring_buffer_consume()

    def ring_fds(self) -> list[int]:
        return [self.bpf["proc_events"].map_fd] if self.bpf is not None else []

    def rearm(self) -> None:
        """Zero the kernel's count of records since the last drain (gpujitter.h
        gj_wake_flags), and with it the latch of its one wake-up: called once a drain is
        over. Zeroed as it began, a wake-up that came during the drain was spent on rings
        that the drain then emptied (the edge-triggered wait reports a ring only if it
        holds records), and the next burst waited out the period."""
        if self.bpf is not None:
            self._pending[ct.c_uint(0)] = ct.c_ulonglong(0)

    def refresh(self, now_ns: int) -> None:
        """Re-resolve the spec (new PIDs of patterns, cgroup members, GPU processes); keep
        the processes the kernel added because a watched parent forked them. Where /proc or
        a watched cgroup cannot be read (out of file descriptors), the set stays as it is,
        the reason in the core's status (degraded), and the next refresh tries again: at its
        RLIMIT_NOFILE the daemon took a watched --pid for exited, and a --comm or --cgroup
        process for one that no longer matched, and stopped attributing its gaps."""
        kernel = {k.value: v.value for k, v in self.bpf["gj_watched"].items()}
        undecided: dict[int, OSError] = {}
        try:
            wanted = resolve(self.spec, self.paths, self.workloads,
                             lambda tgid: self._walks.get(tgid, 0) >= ROOT_WALKS,
                             self._pinned, undecided)  # fmt: skip
            processes = self._fork_followed(kernel)
        except OSError as err:
            self.unreadable = unreadable(self._where(err), err.strerror or str(err))
            return
        self.unreadable = self._undecided(undecided, wanted)
        self._walks = {tgid: self._walks.get(tgid, 0) + 1
                       for tgid, why in wanted.items() if why & ~WHY_FORK}  # fmt: skip
        for tgid in processes:
            wanted[tgid] = wanted.get(tgid, 0) | WHY_FORK
        self._processes = processes
        self.watched = kernel
        self._set(wanted, now_ns, "refresh")

    def _undecided(self, undecided: dict[int, OSError], wanted: dict[int, int]) -> str:
        """Keep what each process whose files failed it alone was watched for (as the whole
        set is kept where /proc cannot be read); the reason names the lowest of them, one
        that is not watched yet may be missed until it can be read."""
        for tgid in undecided:
            if tgid in self.watched:
                wanted[tgid] = wanted.get(tgid, 0) | self.watched[tgid] & ~WHY_FORK
        if not undecided:
            return ""
        first = min(undecided)
        err = undecided[first]
        where = os.fsdecode(err.filename or self.paths.proc / str(first))  # a read names none
        more = f" and {len(undecided) - 1} more" if len(undecided) > 1 else ""
        return unreadable(where + more, err.strerror or str(err), UNDECIDED)

    def _where(self, err: OSError) -> str:
        """What could not be read: /proc for any of its files (one line for all of them, not
        one per process), else the file the error names (a watched cgroup's directory)."""
        name = err.filename
        if name is None or Path(os.fsdecode(name)).is_relative_to(self.paths.proc):
            return str(self.paths.proc)
        return os.fsdecode(name)

    def _fork_followed(self, kernel: dict[int, int]) -> set[int]:
        """The kernel's fork-followed entries that are processes: they stay while the
        process lives (the kernel drops an entry at its exit); thread ids that the fork hook
        added go (their /proc entry names another Tgid). An entry found to be a process once
        is not read again while it stays: beside a training job, its loader workers cost a
        status read each a second otherwise."""
        return {tgid for tgid, why in kernel.items() if why & WHY_FORK
                and (tgid in self._processes or _is_process(self.paths, tgid))}  # fmt: skip

    def _set(self, wanted: dict[int, int], now_ns: int, reason: str) -> None:
        table = self.bpf["gj_watched"]
        added = sorted(set(wanted) - set(self.watched))
        removed = sorted(set(self.watched) - set(wanted))
        for tgid in removed:
            with contextlib.suppress(KeyError):  # the kernel saw it exit first
                del table[ct.c_uint(tgid)]
        for tgid, why in wanted.items():
            if self.watched.get(tgid) != why:
                table[ct.c_uint(tgid)] = ct.c_ubyte(why)
        self.watched = dict(wanted)
        if added or removed:
            watched_changed(self.bpf)
            self.deliver(
                WatchChange(ts_ns=now_ns, added=tuple(added), removed=tuple(removed), reason=reason)
            )
        self._announce(now_ns)

    def _announce(self, now_ns: int) -> None:
        """Say once where each newly watched process runs (those the kernel added on fork
        too, met here at the next refresh), for processes in a container, pod or job."""
        self._announced &= set(self.watched)
        for tgid in sorted(set(self.watched) - self._announced):
            try:
                w = self.workloads.read(tgid)
            except OSError:  # unread, not "in none": read again at the next refresh
                continue
            self._announced.add(tgid)
            if w is not None:
                self.deliver(WorkloadInfo(ts_ns=now_ns, tgid=tgid, workload=w))

    def close(self) -> None:
        """Hand the core back (it stays loaded, see _LoadedCore)."""
        if self.bpf is None:
            return
        with _core_lock:
            if _core is not None:
                _core.give_back(self)
        self.bpf = None
        self._lost = None


UNREADABLE = ": the watched set is kept as it is, and read again each second"
UNDECIDED = (
    ": what those processes were watched for is kept, the rest followed, and they are "
    "read again each second"
)


def unreadable(where: str, why: str, then: str = UNREADABLE) -> str:
    """The core's reason while the watch cannot read `where` (/proc, a watched cgroup, or
    one process's file: UNDECIDED)."""
    return f"cannot read {where} ({why}){then}"


def unreadable_where(reason: str) -> str:
    """What an unreadable() reason says could not be read."""
    head = reason.removeprefix("cannot read ").removesuffix(UNREADABLE).removesuffix(UNDECIDED)
    return head[: head.rfind(" (")] if " (" in head else head


def watched_changed(bpf: Any) -> None:
    """Bump the watched set's generation (gj_config GJ_CFG_GEN): what probes cached of the
    set under the previous one is stale."""
    config = bpf["gj_config"]
    config[ct.c_uint(CFG_GEN)] = ct.c_ulonglong(config[ct.c_uint(CFG_GEN)].value + 1)


def _is_process(paths: HostPaths, tgid: int) -> bool:
    """Whether `tgid` is a process's id (a thread's has a /proc entry too); False once it has
    ended, OSError where its status cannot be read for another reason (read_while_alive)."""
    raw = read_while_alive(f"{paths.proc}/{tgid}/status")
    return raw is not None and parse_status(raw).get("Tgid") == str(tgid)
