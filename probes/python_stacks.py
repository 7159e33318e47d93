"""python_stacks: what Python code the watched threads run, from stack samples taken in the
kernel (python_stacks.bpf.c), so that host work is named by function.

Where: every watched process that runs CPython 3.10-3.13 (found in /proc/PID/maps as
python_gc finds it, looked at once a second until found). How: each of its Python threads
(the interpreter's thread list, read from outside with probes/pyframes.py once a second)
gets a task-clock perf event that runs a BPF program each time the thread has used `period`
(default 10 ms) more of CPU: so every 10 ms of a thread's own CPU time holds a sample, however
the scheduler slices it, and a thread that does not run costs nothing. The program reads the
innermost Python frame from the thread's own memory and streams the code object's address
with its name and file pointers; user space reads the text once per code object
(pyframes.Interpreter.frame_at). A thread with no Python frame then (a native thread that
holds a thread state) streams its user-space instruction address instead, named here by
symbol and module (native_names.py) as a native frame (events.NATIVE_LINE). A feeder in no
interpreter's thread list (a native thread that never took a thread state: libtorch's, a
C++ launcher's, any thread of a watched process with no Python) gets a perf event too,
marked native-only (thread state 0): its samples are native frames, read with no thread
state (MAX_NATIVE_ONLY such threads at most). One budget is shared by all threads: one
sample per `spacing` (default 10 ms: 100 samples/s however many threads run), the feeding
threads the other probes' events named first (probes/feeders.py: libcuda callers, GIL
waiters and holders, the wakers of those): while some are known the others share a
twentieth of it, and only one of them at a time keeps its perf event on (an event on costs
its thread ~1 us a context switch). Past the budget the others' periods are thinned at
random, so that each thread's samples follow its CPU time, not its timer's phase
(bpf/python_stacks_budget.h). No thread of gpujitter wakes to sample, no signal, nothing
written into the job. Another version, or a build whose layout is not known, is named once
in the probe's status and its host work stays unnamed.
Cost: docs/performance.md (bench/python_stacks_cost.py).
"""

from __future__ import annotations

import ctypes as ct
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpujitter.probes.base import BPF_DIR, BpfProbe, ProbeContext
from gpujitter.probes.events import NATIVE_LINE, PySample
from gpujitter.probes.feeders import Feeders
from gpujitter.probes.host import status_fields
from gpujitter.probes.mapped_scan import MappedScan
from gpujitter.probes.native_names import NativeNames
from gpujitter.probes.perf_event import ATTR_DISABLED, PerfEventAttr, bpf_event_fd, set_enabled
from gpujitter.probes.procfs import thread_count
from gpujitter.probes.pyframes import OWNED_BY_CSTACK, Interpreter, Layout, NotReadable
from gpujitter.probes.registry import Hook, ProbeSpec

# A process's thread list is looked at this often, and read again where its number of
# threads changed since the last read (a stat; the read walks the interpreter's list through
# its memory: ~60 µs a process on the H200, eleven of them beside its training job), or
# THREADS_AT_MOST_NS after it: a thread that ended and one that began meanwhile keep the count.
THREADS_EVERY_NS = 1_000_000_000
THREADS_AT_MOST_NS = 10_000_000_000
BURST_SAMPLES = 8  # an idle stretch saves up no more than this many samples
# Past the budget, the non-feeders' periods are thinned at random to THIN_PCT % of its rate,
# from their rate over the last THIN_WINDOW_NS (python_stacks_budget.h says why).
THIN_WINDOW_NS, THIN_PCT = 100_000_000, 80
OTHERS_SHARE = 20  # while feeders are known, the others get 1/OTHERS_SHARE of the budget
MAX_WALK = 16  # frames walked past shims and non-code before a sample gives up
PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK = 1, 1
# Feeders sampled with no thread state at once, at most (a perf event and a status read a
# second each): a job's launcher, loader and NCCL threads fit.
MAX_NATIVE_ONLY = 16
NATIVE_ONLY = 0  # the thread state of a native-only thread in py_threads

# What the .bpf.c gets as -D options besides the thresholds (it never restates them).
CONSTANTS = {
    "BURST_SAMPLES": BURST_SAMPLES,
    "THIN_WINDOW_NS": THIN_WINDOW_NS,
    "THIN_PCT": THIN_PCT,
    "MAX_WALK": MAX_WALK,
    "OWNED_BY_CSTACK": OWNED_BY_CSTACK,
}


def task_clock_fd(prog_fd: int, tid: int, period_ns: int) -> int:
    """A task-clock perf event on thread `tid` that runs BPF program prog_fd after every
    period_ns of the thread's CPU time. Returns its fd (close it to stop); raises OSError
    (the thread ended, no permission)."""
    attr = PerfEventAttr()
    attr.type, attr.config = PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK
    attr.sample_period = period_ns
    attr.flags = ATTR_DISABLED  # enabled once the program is set
    return bpf_event_fd(attr, tid, -1, prog_fd, f"the task-clock of thread {tid}")


def native_only(
    feeders: Iterable[int],
    python: set[int],
    held: set[int],
    process_of: Callable[[int], int | None],
) -> dict[tuple[int, int], int]:
    """The feeders to sample by their native frame alone, as (pid, tid) -> NATIVE_ONLY: those
    not in an interpreter's thread list (`python`) whose process_of(tid) names a watched
    process (None: gone, a kernel thread, not watched); those `held` already first, then by
    thread id, MAX_NATIVE_ONLY at most."""
    found: dict[tuple[int, int], int] = {}
    for tid in sorted(set(feeders) - python, key=lambda t: (t not in held, t)):
        if len(found) == MAX_NATIVE_ONLY:
            break
        pid = process_of(tid)
        if pid is not None:
            found[(pid, tid)] = NATIVE_ONLY
    return found


def proc_entry(leaf: Any, interp: Interpreter) -> Any:
    """struct py_proc of python_stacks.bpf.c for one interpreter."""
    lay: Layout = interp.layout
    return leaf(
        code_type=interp.code_type,
        tstate_frame=lay.tstate_frame,
        cframe_current_frame=lay.cframe_current_frame if lay.frame_via_cframe else -1,
        frame_code=lay.frame_code,
        frame_previous=lay.frame_previous,
        frame_owner=lay.frame_owner,
        code_filename=lay.code_filename,
        code_name=lay.code_name,
        code_firstlineno=lay.code_firstlineno,
    )


class PythonStacksProbe(BpfProbe):
    bpf_file = "python_stacks.bpf.c"
    rings = ("py_samples",)
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.scan = MappedScan()
        self.native = NativeNames()
        self.interpreters: dict[int, Interpreter] = {}
        self.refused: dict[str, str] = {}  # interpreter file -> why its stacks are not read
        self.samples = 0
        self._failed_here = 0  # thread lists and code objects that could not be read
        self._core: Any = None
        self._feeders = Feeders()
        self._feeder_changes = -1  # the feeders' change count last written to the kernel
        self._feeding: set[int] = set()  # the sampled threads that feed, as last written
        self._enabled: set[tuple[int, int]] = set()  # (pid, tid) whose perf event is on
        self._turn = 0  # which other thread keeps its event on while feeders are known
        self._prog_fd = -1
        # pid -> when its thread list was read, and its number of threads then; (pid, tid) ->
        # [perf event fd, thread state (NATIVE_ONLY: a feeder in no thread list)]
        self._listed: dict[int, tuple[int, int]] = {}
        self._sampled: dict[tuple[int, int], tuple[int, int]] = {}

    @property
    def failed_reads(self) -> int:
        """Reads that failed: samples the kernel dropped (a page not resident, a frame freed
        under the walk), thread lists and code objects' text here."""
        failed = sum(int(v.value) for v in self.bpf["py_failed"].values()) if self.bpf else 0
        return failed + self._failed_here

    def cflags(self, ctx: ProbeContext) -> list[str]:
        """The thresholds, the constants, the others' spacing while feeders are known, and
        where the budget's header is (python_stacks_budget.h, beside gpujitter.h)."""
        spacing_ns = max(1, self.threshold(ctx, "spacing"))
        return [
            *super().cflags(ctx),
            f"-DOTHERS_SPACING_NS={OTHERS_SHARE * spacing_ns}LL",
            f"-I{BPF_DIR}",
        ]

    def start(self, ctx: ProbeContext) -> None:
        self._core = ctx.watched_set("sample")
        self._feeders = ctx.shared.get("feeders", self._feeders)
        self.period_ns = max(1, self.threshold(ctx, "period"))
        super().start(ctx)
        self._find(time.monotonic_ns())

    def attach(self, ctx: ProbeContext) -> None:
        from bcc import BPF

        self._prog_fd = int(self.bpf.load_func("py_tick", BPF.PERF_EVENT).fd)

    def _find(self, now_ns: int) -> None:
        """Look at the watched processes not yet looked at (the watched set lives in the
        core's BPF maps), forget those that exited, read the thread lists that are due."""
        procs = self.bpf["py_procs"]
        watched = self._core.watched_pids()
        for pid in self.scan.due(watched, now_ns):
            try:
                interp = Interpreter(pid)
            except NotReadable as err:
                if err.path:
                    self.refused.setdefault(err.path, str(err))
                    self.scan.done(pid)
                continue  # not Python (yet: an interpreter loaded later is looked at again)
            self.interpreters[pid] = interp
            procs[ct.c_uint32(pid)] = proc_entry(procs.Leaf, interp)
            self.scan.done(pid)
        for pid in self.scan.forget_exited():
            self.native.forget(pid)
            if self.interpreters.pop(pid, None) is not None:
                del procs[ct.c_uint32(pid)]
                self._threads(pid, {})
                self._listed.pop(pid, None)
        for pid, interp in self.interpreters.items():
            listed_ns, count = self._listed.get(pid, (-THREADS_AT_MOST_NS, -1))
            if now_ns - listed_ns < THREADS_EVERY_NS:
                continue
            now_count = thread_count(self.scan.paths, pid)
            if now_count == count and now_ns - listed_ns < THREADS_AT_MOST_NS:
                continue
            try:
                threads = interp.threads()
            except OSError:
                self._failed_here += 1
                continue
            self._listed[pid] = (now_ns, now_count)
            self._threads(pid, threads)
        self._push_feeders(now_ns, rescan=True, watched=watched)  # exited native-only go
        versions = sorted({i.version for i in self.interpreters.values()})
        said = "; ".join(f"{path}: {why}" for path, why in sorted(self.refused.items()))
        native = sum(1 for _, tstate in self._sampled.values() if tstate == NATIVE_ONLY)
        self.state = "running"
        self.reason = (
            ", ".join(
                x
                for x in (
                    f"sampling CPython {', '.join(versions)}" if versions else "",
                    f"feeders with no thread state (native frames): {native}" if native else "",
                    said,
                )
                if x
            )
            or "no CPython process among the watched ones yet"
        )

    def _threads(self, pid: int, threads: dict[int, int]) -> None:
        """Sample the process's Python threads `threads` (tid -> thread state) from now on,
        and no longer its others but the native-only ones (_native_only's)."""
        for key, (_, tstate) in list(self._sampled.items()):
            if key[0] == pid and key[1] not in threads and tstate != NATIVE_ONLY:
                self._unsample(key)
        for tid, tstate in threads.items():
            self._sample((pid, tid), tstate)

    def _native_only(self, feeders: set[int], watched: list[int] | None) -> None:
        """Sample the feeders in no thread list by their native frame (native_only()), and
        no longer those that exited, stopped feeding or took a thread state."""
        python = {tid for (_, tid), (_, ts) in self._sampled.items() if ts != NATIVE_ONLY}
        held = {key for key, (_, ts) in self._sampled.items() if ts == NATIVE_ONLY}
        allowed = None if watched is None else set(watched)
        wanted = native_only(
            feeders, python, {tid for _, tid in held}, lambda tid: self._process_of(tid, allowed)
        )
        for key in held - wanted.keys():
            self._unsample(key)
        for key, tstate in wanted.items():
            self._sample(key, tstate)

    def _process_of(self, tid: int, allowed: set[int] | None) -> int | None:
        """The process of thread `tid` if it is watched (in `allowed`, None: every one but
        gpujitter) and has user memory (a kernel thread, or one exiting, has none)."""
        status = status_fields(self.scan.paths, tid)
        pid = int(status.get("Tgid") or 0)
        mapped = "VmSize" in status
        ok = mapped and pid != os.getpid() and (allowed is None or pid in allowed)
        return pid if ok else None

    def _sample(self, key: tuple[int, int], tstate: int) -> None:
        """Sample thread key = (pid, tid) with thread state tstate: its perf event opened
        unless it has one (a native-only thread found in a thread list keeps its own)."""
        had = self._sampled.get(key)
        if had is not None and had[1] == tstate:
            return
        if had is None:
            try:
                had = (task_clock_fd(self._prog_fd, key[1], self.period_ns), tstate)
            except OSError:  # the thread ended since it was listed
                return
            self._enabled.add(key)
        self._sampled[key] = (had[0], tstate)
        table = self.bpf["py_threads"]
        table[ct.c_uint32(key[1])] = table.Leaf(tstate=tstate, tgid=key[0], feeder=0)
        self._feeder_changes = -1  # new entries say feeder=0: write the flags again

    def _unsample(self, key: tuple[int, int]) -> None:
        os.close(self._sampled.pop(key)[0])
        self._enabled.discard(key)
        self.bpf["py_threads"].pop(ct.c_uint32(key[1]), None)
        self._feeder_changes = -1  # the feeders known may be fewer

    def _push_feeders(
        self, now_ns: int, *, rescan: bool = False, watched: list[int] | None = None
    ) -> None:
        """Tell the kernel which sampled threads feed, when that changed. rescan (the
        once-a-second look, with its `watched`): the native-only threads are looked at again
        even when the feeders did not change (one may have exited), in the same pass."""
        if not rescan and self._feeders.changes == self._feeder_changes:
            return
        feeders = self._feeders.recent(now_ns)  # forgets those not named for a while
        self._native_only(feeders, watched if rescan else self._core.watched_pids())
        if self._feeders.changes == self._feeder_changes:
            return  # _sample and _unsample mark a change where they made one
        self._feeder_changes = self._feeders.changes
        table = self.bpf["py_threads"]
        self._feeding = {tid for _, tid in self._sampled if tid in feeders}
        for (pid, tid), (_, tstate) in self._sampled.items():
            feeder = int(tid in feeders)
            table[ct.c_uint32(tid)] = table.Leaf(tstate=tstate, tgid=pid, feeder=feeder)
        self.bpf["py_feeders_known"][ct.c_uint32(0)] = ct.c_uint32(bool(self._feeding))
        self._switch_events()

    def _switch_events(self) -> None:
        """While feeders are known, the perf events of the others are off but one's, in turn
        (a second each): an event that is on costs its thread ~1 µs at every context switch
        (its timer stopped and started), and the others get a twentieth of the budget."""
        others = sorted(k for k in self._sampled if k[1] not in self._feeding)
        turn = others[self._turn % len(others)] if others and self._feeding else None
        for key, (fd, _) in self._sampled.items():
            on = not self._feeding or key[1] in self._feeding or key == turn
            if on != (key in self._enabled):
                set_enabled(fd, on)
                (self._enabled.add if on else self._enabled.discard)(key)

    def poll(self) -> None:
        if self.bpf is not None:
            self._push_feeders(time.monotonic_ns())
        super().poll()

    def decode(self, ring: str, rec: Any) -> PySample | None:
        func, file, line = "", "", 0
        if rec.code:
            interp = self.interpreters.get(rec.tgid)
            if interp is None:
                return None
            try:
                frame = interp.frame_at(rec.code, rec.filename, rec.name, rec.firstlineno)
            except OSError:
                self._failed_here += 1
                return None
            func, file, line = frame.func, frame.file, frame.line
        elif rec.ip:
            func, file = self.native.name(rec.tgid, rec.ip, time.monotonic_ns())
            line = NATIVE_LINE
        self.samples += 1
        return PySample(ts_ns=rec.ts_ns, tid=rec.tid, tgid=rec.tgid, func=func, file=file,
                        line=line)  # fmt: skip

    def sample(self, now_ns: int) -> tuple[()]:
        if self.bpf is not None:
            self._find(now_ns)
            self._turn += 1
            self._switch_events()
        return ()

    def close(self) -> None:
        for fd, _ in self._sampled.values():
            os.close(fd)
        self._sampled.clear()
        self._enabled.clear()
        self.native.close()
        super().close()


SPECS = (
    ProbeSpec(
        name="python_stacks",
        summary="innermost Python frame of watched threads per 10 ms of their CPU (CPython "
        "3.10-3.13, read in the kernel: 100 samples/s shared by all threads, feeders first)",
        default_on=True,
        hooks=(Hook("perf_event", "software:task-clock"),),
        degrades="host work is not named by the Python function that ran",
        factory=PythonStacksProbe,
        thresholds={"period": 10_000_000, "spacing": 10_000_000},
    ),
)
