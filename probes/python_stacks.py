"""python_stacks: what Python code the watched threads run, from stack samples read from
outside the process (probes/pyframes.py), so that host work is named by function.

Where: every watched process that runs CPython 3.10-3.13 (found in /proc/PID/maps as
python_gc finds it, looked at once a second until found). How: a thread of this probe wakes
every `period` (default 10 ms, ~100 Hz) and, for each such process, reads its thread list;
each thread the kernel shows running (state R) has its innermost Python frame read and
streamed as a PySample. Sleeping threads cost one /proc read and nothing else. No BPF, no
signal, nothing written into the job. Another version, or a build whose layout is not known,
is named once in the probe's status and its host work stays unnamed.
Cost: docs/performance.md (bench/python_stacks_cost.py).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

from gpujitter.probes.base import Probe, ProbeContext, ProbeUnavailable
from gpujitter.probes.events import PySample
from gpujitter.probes.mapped_scan import MappedScan, watched_pids
from gpujitter.probes.procfs import task_state
from gpujitter.probes.pyframes import Frame, Interpreter, NotReadable
from gpujitter.probes.registry import ProbeSpec

QUEUE_MAX = 4096  # samples held between two polls (50 ms): far above 100 Hz x threads
THREADS_EVERY_NS = 1_000_000_000  # a process's thread list is walked again this often


class ThreadStates:
    """Whether the kernel shows threads running (or runnable) now, from their stat files,
    kept open between ticks (a fresh read from offset 0 is current; no open/close a tick)."""

    def __init__(self) -> None:
        self._fds: dict[tuple[int, int], int] = {}

    def running(self, pid: int, tid: int) -> bool:
        fd = self._fds.get((pid, tid))
        try:
            if fd is None:
                fd = self._fds[(pid, tid)] = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY)
            stat = os.pread(fd, 512, 0)
        except OSError:  # the thread ended
            self.forget(pid, tid)
            return False
        return task_state(stat) == "R"

    def forget(self, pid: int, tid: int) -> None:
        fd = self._fds.pop((pid, tid), None)
        if fd is not None:
            os.close(fd)

    def keep(self, pid: int, tids: set[int]) -> None:
        """Close the files of the process's threads not among tids."""
        for key in [k for k in self._fds if k[0] == pid and k[1] not in tids]:
            self.forget(*key)


class PythonStacksProbe(Probe):
    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.scan = MappedScan()
        self.interpreters: dict[int, Interpreter] = {}  # replaced whole, read by the sampler
        self.refused: dict[str, str] = {}  # interpreter file -> why its stacks are not read
        self.samples = 0
        self.failed_reads = 0
        self._queue: collections.deque[PySample] = collections.deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._core: Any = None
        self._states = ThreadStates()
        # pid -> (when its thread list was read, tid -> thread state address); sampler only
        self._threads: dict[int, tuple[int, dict[int, int]]] = {}

    def start(self, ctx: ProbeContext) -> None:
        self._emit = ctx.emit
        self._core = ctx.shared.get("core")
        if self._core is None:
            raise ProbeUnavailable("no watched set to sample (the core module is not loaded)")
        self.period_ns = self.threshold(ctx, "period")
        self._find()
        self._thread = threading.Thread(target=self._run, name="gpujitter-pystacks", daemon=True)
        self._thread.start()

    def _find(self) -> None:
        """Look at the watched processes not yet looked at (on the probe thread: the watched
        set lives in the core's BPF maps)."""
        found = dict(self.interpreters)
        for pid in self.scan.due(watched_pids(self._core.bpf), time.monotonic_ns()):
            try:
                found[pid] = Interpreter(pid)
            except NotReadable as err:
                if not err.path:
                    continue  # not Python (yet: an interpreter loaded later is looked at again)
                self.refused.setdefault(err.path, str(err))
            self.scan.done(pid)
        for pid in self.scan.forget_exited():
            found.pop(pid, None)
        self.interpreters = found
        versions = sorted({i.version for i in found.values()})
        said = "; ".join(f"{path}: {why}" for path, why in sorted(self.refused.items()))
        self.state = "running"
        self.reason = (
            ", ".join(
                x
                for x in (f"sampling CPython {', '.join(versions)}" if versions else "", said)
                if x
            )
            or "no CPython process among the watched ones yet"
        )

    def _run(self) -> None:
        deadline = time.monotonic_ns()
        while not self._stop.is_set():
            interpreters = self.interpreters
            for pid, interp in interpreters.items():
                self._sample(pid, interp)
            for gone in set(self._threads) - set(interpreters):
                del self._threads[gone]
                self._states.keep(gone, set())
            deadline += self.period_ns
            wait = deadline - time.monotonic_ns()
            if wait < 0:  # fell behind (a busy CPU): skip the missed ticks, never catch up
                deadline, wait = time.monotonic_ns(), 0
            self._stop.wait(wait / 1e9)

    def _thread_list(self, pid: int, interp: Interpreter, now: int) -> dict[int, int]:
        """The process's Python threads, walked again once a second (threads come and go
        rarely; a thread state freed meanwhile reads as no frame, or fails)."""
        read_at, threads = self._threads.get(pid, (-THREADS_EVERY_NS, {}))
        if now - read_at >= THREADS_EVERY_NS:
            threads = interp.threads()
            self._states.keep(pid, set(threads))
            self._threads[pid] = (now, threads)
        return threads

    def _sample(self, pid: int, interp: Interpreter) -> None:
        try:
            threads = self._thread_list(pid, interp, time.monotonic_ns())
        except OSError:
            self.failed_reads += 1
            return
        for tid, tstate in threads.items():
            if not self._states.running(pid, tid):
                continue
            ts = time.monotonic_ns()
            try:
                frames = interp.stack(tstate, 1)
            except OSError:
                self.failed_reads += 1
                continue
            top = frames[0] if frames else Frame("", "", 0)
            sample = PySample(
                ts_ns=ts, tid=tid, tgid=pid, func=top.func, file=top.file, line=top.line
            )
            with self._lock:
                if len(self._queue) >= QUEUE_MAX:
                    self.lost_user += 1
                    continue
                self._queue.append(sample)

    def poll(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, collections.deque()
        for sample in batch:
            self.samples += 1
            self.deliver(sample)

    def sample(self, now_ns: int) -> tuple[()]:
        self._find()
        return ()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        for pid in list(self._threads):
            self._states.keep(pid, set())


SPECS = (
    ProbeSpec(
        name="python_stacks",
        summary="innermost Python frame of running watched threads (CPython 3.10-3.13, "
        "read from outside at ~100 Hz)",
        default_on=True,
        hooks=(),
        degrades="host work is not named by the Python function that ran",
        factory=PythonStacksProbe,
        thresholds={"period": 10_000_000},
    ),
)
