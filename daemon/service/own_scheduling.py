"""How gpujitter's own threads are scheduled so that the observer does not delay the observed:
one policy and nice level for all of them (they share the GIL), the CPUs kept clear for the
watched processes, work in short slices, and the list of its threads (meta.self) by which the engine
tells a wait behind gpujitter itself (docs/architecture.md, "The daemon's own scheduling")."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from gpujitter.probes.events import OwnThreads
from gpujitter.probes.host import HostPaths
from gpujitter.probes.procfs import task_ids, task_stat_fields

T = TypeVar("T")

SLICE_NS = 2_000_000  # longest stretch of work before a loop gives the CPU away


# Every thread of the daemon runs SCHED_BATCH (it never preempts a waking task and shares a
# busy CPU by its nice level) at one level, KEEP_UP_LEVELS[level]. One level, not one per
# role: the threads share the GIL, and one that a busier task preempts while it holds the GIL
# stops all the others until it runs again. A lower level makes that wait longer, not the
# thread cheaper: with the stream thread SCHED_IDLE and busy (a flood of 200 connections), the
# soak under a one-CPU hog saw the main loop go 3.6-5.8 s between watchdog pings;
# bench/gil_inversion.py (a busy thread beside a nice-10 loop, four hogs on their CPU) held the
# loop up to 5.8-8.0 s with that thread SCHED_IDLE, 1.1-1.2 s at nice 19, 0.15-0.17 s at the
# loop's own level (docs/architecture.md, "The daemon's own scheduling").
_KEEPS_UP = 10
# While events are being lost, or the main loop falls behind (a saturated node leaves nice 10
# too small a share: measured, docs/performance.md), the threads step towards nice 0, a level
# per tick that lost events or came late, and back a level after each QUIET_NS of neither.
# Still SCHED_BATCH: even at nice 0 they never preempt a waking thread.
KEEP_UP_LEVELS = (_KEEPS_UP, 5, 0)
QUIET_NS = 60_000_000_000
# A tick (due once a second) this late means the main loop got well under half a CPU's
# worth of turns for a second: a systemd watchdog ping (half its interval apart) is as late.
LATE_NS = 1_000_000_000


class OwnScheduling:
    """The scheduling of this process's threads. `tend` (at start, then once a second) gives
    each thread it has not seen the policy, level and CPUs, and returns the announcement of the
    threads when they changed; `keep_off` moves every thread off the CPUs the watched
    processes may run on, when any others are allowed. What cannot be set (no privilege) is
    said once in `notes` and left as it was.

    `shared`: the runtime lives in a process that was there before it (a drill, a test, the
    TUI's embedded runtime): the threads that process had at construction keep their
    scheduling and only the ones started since are tended, but all are announced (a wait
    behind any of them is a wait behind gpujitter). Otherwise a caller cut short before the
    runtime ends (a test's timeout while the probes compile) stays at nice 10 batch on a CPU
    another task is using, and so does everything it starts later."""

    def __init__(self, proc: Path = Path("/proc"), level: int = 0, *, shared: bool = False) -> None:
        self.proc = proc
        self.pid = os.getpid()
        self._host = self.tids() if shared else set()  # the caller's threads: left alone
        self.base_cpus = frozenset(os.sched_getaffinity(0))  # where it may run: systemd's
        self.cpus = self.base_cpus
        # Whether the last keep_off found every CPU open to the watched processes, and so
        # chose by the feeding threads: a new one matters then, and only then.
        self.by_feeders = False
        self.notes: list[str] = []
        self.level = level  # index into KEEP_UP_LEVELS
        self._seen: set[int] = set()
        self._refused: set[str] = set()
        self._lost = 0
        self._quiet_since = 0
        # tid -> (policy, nice, CPUs) before the first change: what restore() puts back.
        self._original: dict[int, tuple[int, int, set[int]]] = {}

    def tids(self) -> set[int]:
        return set(task_ids(HostPaths(proc=self.proc), self.pid)) or {threading.get_native_id()}

    def runs_here(self) -> None:
        """The calling thread runs the runtime: tended even when it was the caller's."""
        self._host.discard(threading.get_native_id())

    def tend(self, now_ns: int) -> OwnThreads | None:
        tids = self.tids()
        for tid in sorted(tids - self._seen - self._host):
            self._remember(tid)
            self._set_policy(tid)
            self._set_cpus(tid, self.cpus)
        changed = tids != self._seen
        self._seen = tids
        if not changed:
            return None
        return OwnThreads(ts_ns=now_ns, tgid=self.pid, tids=tuple(sorted(tids)))

    @property
    def nice(self) -> int:
        """The nice level of the daemon's threads, now."""
        return KEEP_UP_LEVELS[self.level]

    def keep_up(self, lost_total: int, now_ns: int, late_ns: int = 0) -> None:
        """Called each tick with the events lost so far (kernel rings, queues) and how late
        the tick came (the main loop starved: its analysis and its watchdog pings wait): a
        tick that lost some or came LATE_NS late lowers the threads' nice level
        one step; QUIET_NS of neither raises it one step. A change is said in `notes`."""
        lost, self._lost = lost_total - self._lost, lost_total
        if lost > 0 or late_ns >= LATE_NS:
            self._quiet_since = now_ns
            step = min(self.level + 1, len(KEEP_UP_LEVELS) - 1)
            why = (f"{lost} events lost in the last tick" if lost > 0
                   else f"the main loop's tick came {late_ns / 1e9:.1f} s late")  # fmt: skip
        elif now_ns - self._quiet_since >= QUIET_NS:
            self._quiet_since = now_ns
            step = max(self.level - 1, 0)
            why = "no events lost and no tick late for a minute"
        else:
            return
        self.step_to(step, why)

    def step_to(self, level: int, why: str = "") -> None:
        """Put the threads at KEEP_UP_LEVELS[level]; `why` is said."""
        if level == self.level:
            return
        self.level = level
        for tid in sorted(self._seen - self._host):
            self._set_nice(tid, self.nice)
        if why:
            self.notes.append(f"the daemon's threads now at nice {self.nice} "
                              f"({why})")  # fmt: skip

    def keep_off(self, watched: Iterable[int], feeders: Iterable[int] = ()) -> frozenset[int]:
        """Run on the CPUs the watched processes' threads may not use; where that leaves
        none, on those the feeding threads (`feeders`: the tids that call CUDA, whose waits
        idle a GPU) may not use; where that leaves none too, on all this process may use
        (never on nothing). Returns the CPUs chosen."""
        theirs: set[int] = set()
        for tgid in watched:
            theirs |= allowed_cpus(self.proc, tgid)
        cpus = self.base_cpus - theirs
        self.by_feeders = not cpus
        if not cpus:
            # A job's helpers free to run anywhere (a forked child, a pool) left the daemon on
            # the feeding thread's own CPU: its waits behind the daemon were self-inflicted
            # gaps (a churning child beside a feeder pinned to CPU 1: 107 in 10 minutes).
            feeding: set[int] = set()
            for tid in feeders:
                with contextlib.suppress(OSError):  # gone
                    feeding |= os.sched_getaffinity(tid)
            cpus = (self.base_cpus - feeding) or self.base_cpus
        if cpus != self.cpus:
            self.cpus = cpus
            for tid in sorted(self._seen - self._host):  # tend() pins the ones it meets later
                self._set_cpus(tid, cpus)
        return cpus

    def restore(self) -> None:
        """Put every thread this changed back as it was: for a bounded job inside a longer
        process (a drill run by a test session or a bench), whose later children would
        otherwise inherit gpujitter's own scheduling (nice 10, batch, off the job's CPUs)."""
        for tid, (policy, nice, cpus) in self._original.items():
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, policy, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                os.sched_setaffinity(tid, cpus)
        self._original.clear()
        self._seen.clear()

    def _remember(self, tid: int) -> None:
        with contextlib.suppress(OSError):
            self._original[tid] = (
                os.sched_getscheduler(tid),
                os.getpriority(os.PRIO_PROCESS, tid),
                os.sched_getaffinity(tid),
            )

    def _set_policy(self, tid: int) -> None:
        self._set_nice(tid, self.nice)
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except ProcessLookupError:
            return  # the thread ended meanwhile
        except OSError as err:
            self._refuse("policy", f"cannot set the policy of thread {tid}: {err.strerror}")

    def _set_nice(self, tid: int, nice: int) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            return
        except OSError as err:  # raising priority needs RLIMIT_NICE (LimitNICE=) or CAP_SYS_NICE
            self._refuse("nice", f"cannot set thread {tid} to nice {nice}: {err.strerror}")

    def _set_cpus(self, tid: int, cpus: frozenset[int]) -> None:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            return
        except OSError as err:
            self._refuse("cpus", f"cannot move thread {tid} to CPUs {sorted(cpus)}: "
                                 f"{err.strerror}")  # fmt: skip

    def _refuse(self, what: str, text: str) -> None:
        if what not in self._refused:
            self._refused.add(what)
            self.notes.append(f"{text}; it keeps running as it was (said once)")


def thread_policies(proc: Path, pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (policy, nice) of each thread of process pid, as /proc/PID/task/TID/stat says
    (policy: normal, fifo, rr, batch, idle, deadline)."""
    out: dict[int, tuple[str, int]] = {}
    for tid in task_ids(HostPaths(proc=proc), pid):
        with contextlib.suppress(OSError, ValueError, IndexError):  # gone, or cut short
            fields = task_stat_fields((proc / str(pid) / "task" / str(tid) / "stat").read_bytes())
            out[tid] = (_POLICY_NAMES[int(fields[38])], int(fields[16]))
    return out


# By policy number; "ext" is sched_ext's (6.12 on): a thread under it was dropped unnamed.
_POLICY_NAMES = ("normal", "fifo", "rr", "batch", "iso", "idle", "deadline", "ext")


def allowed_cpus(proc: Path, tgid: int) -> set[int]:
    """The CPUs any thread of process tgid may run on (empty when it is gone)."""
    cpus: set[int] = set()
    for tid in task_ids(HostPaths(proc=proc), tgid):
        with contextlib.suppress(OSError):
            cpus |= os.sched_getaffinity(tid)
    return cpus


def in_slices(items: Iterable[T], slice_ns: int = SLICE_NS) -> Iterator[T]:
    """The items, with the CPU given away (sched_yield) after every `slice_ns` of work: a
    long batch never holds a CPU a watched thread waits for longer than one slice. The
    slice starts with the first item: `items` may wait for it (the runtime's queue waits up
    to 100 ms), and that wait is no work (counted, it cost a yield per batch)."""
    until = 0
    for item in items:
        if not until:
            until = time.monotonic_ns() + slice_ns
        yield item
        if time.monotonic_ns() >= until:
            os.sched_yield()
            until = time.monotonic_ns() + slice_ns
