"""python_stacks: what Python code the watched threads run, from stack samples read from
outside the process (probes/pyframes.py), so that host work is named by function.

Where: every watched process that runs CPython 3.10-3.13 (found in /proc/PID/maps as
python_gc finds it, looked at once a second until found). How: a thread of this probe wakes
every `period` (default 10 ms) while such a process is watched and spends a budget shared by
all their threads: one sample per `spacing` in all (default 10 ms: 100 samples/s however
many threads run). It looks first at the feeding threads the other probes' events named
(probes/feeders.py: libcuda callers, GIL waiters and holders, the wakers of those), then at
the others in turn; a thread the kernel shows running (state R) has its innermost Python
frame read and streamed as a PySample. Looking at a thread costs one /proc read, and a tick
looks at no more than LOOKS_PER_SAMPLE threads per sample it may take, so the cost is bounded
whatever the number of threads. No BPF, no signal, nothing written into the job. Another
version, or a build whose layout is not known, is named once in the probe's status and its
host work stays unnamed.
Cost: docs/performance.md (bench/python_stacks_cost.py).
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from gpujitter.probes.base import Probe, ProbeContext, ProbeUnavailable
from gpujitter.probes.events import PySample
from gpujitter.probes.feeders import Feeders
from gpujitter.probes.mapped_scan import MappedScan, watched_pids
from gpujitter.probes.procfs import task_state
from gpujitter.probes.pyframes import Frame, Interpreter, NotReadable
from gpujitter.probes.registry import ProbeSpec

QUEUE_MAX = 4096  # samples held between two polls (50 ms): far above the budget's 100/s
THREADS_EVERY_NS = 1_000_000_000  # a process's thread list is walked again this often
LOOKS_PER_SAMPLE = 4  # state reads a tick may spend per sample it may take
IDLE_WAIT_S = 1.0  # with no Python process watched, the sampler looks again this often


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


def _from(keys: list[tuple[int, int]], turn: int) -> Iterator[tuple[int, int]]:
    """The keys in turn, beginning at the turn-th (modulo their number), not copied."""
    start = turn % len(keys) if keys else 0
    return itertools.chain(itertools.islice(keys, start, None), itertools.islice(keys, start))


class PythonStacksProbe(Probe):
    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.scan = MappedScan()
        self.interpreters: dict[int, Interpreter] = {}  # replaced whole, read by the sampler
        self.refused: dict[str, str] = {}  # interpreter file -> why its stacks are not read
        self.samples = 0
        self.failed_reads = 0
        self.ticks = 0  # the sampler's wake-ups, for the cost bench
        self._queue: collections.deque[PySample] = collections.deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set when a process to sample appears (or on close)
        self._thread: threading.Thread | None = None
        self._core: Any = None
        self._feeders = Feeders()
        self._states = ThreadStates()
        # pid -> (when its thread list was read, tid -> thread state address); sampler only
        self._threads: dict[int, tuple[int, dict[int, int]]] = {}
        self._credit_ns = 0  # the budget not yet spent: one sample per spacing_ns of it
        self._turns = (0, 0)  # where the next looks at the feeders and the others begin
        self._owner: dict[int, int] = {}  # tid -> pid, of the threads sampled
        self._keys: list[tuple[int, int]] = []  # (pid, tid) of those threads, in order
        self._indexed = 0  # processes in _owner

    def start(self, ctx: ProbeContext) -> None:
        self._emit = ctx.emit
        self._core = ctx.shared.get("core")
        if self._core is None:
            raise ProbeUnavailable("no watched set to sample (the core module is not loaded)")
        self._feeders = ctx.shared.get("feeders", self._feeders)
        self.period_ns = self.threshold(ctx, "period")
        self.spacing_ns = max(1, self.threshold(ctx, "spacing"))
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
        if found:
            self._wake.set()
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
            for gone in set(self._threads) - set(interpreters):
                del self._threads[gone]
                self._states.keep(gone, set())
            if not interpreters:  # nothing to sample: no wake-ups at the tick's rate
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                deadline = time.monotonic_ns()
                continue
            self.ticks += 1
            self._tick(interpreters)
            deadline += self.period_ns
            wait = deadline - time.monotonic_ns()
            if wait < 0:  # fell behind (a busy CPU): skip the missed ticks, never catch up
                deadline, wait = time.monotonic_ns(), 0
            # time.sleep, not an Event's wait: half the CPU a wake-up here (close() waits
            # out one period at most)
            time.sleep(wait / 1e9)

    def _refresh(self, interpreters: dict[int, Interpreter], now: int) -> None:
        """Walk again the thread lists that are due, once a second a process (threads come
        and go rarely; a thread state freed meanwhile reads as no frame, or fails); the
        sampled threads in order, and the process of each, rebuilt only when one was read."""
        changed = False
        for pid, interp in interpreters.items():
            if now - self._threads.get(pid, (-THREADS_EVERY_NS, {}))[0] < THREADS_EVERY_NS:
                continue
            try:
                threads = interp.threads()
            except OSError:
                self.failed_reads += 1
                threads = {}
            self._states.keep(pid, set(threads))
            self._threads[pid] = (now, threads)
            changed = True
        if changed or len(self._threads) != self._indexed:
            self._owner = {
                tid: pid for pid in sorted(self._threads) for tid in self._threads[pid][1]
            }
            self._keys = sorted((pid, tid) for tid, pid in self._owner.items())
            self._indexed = len(self._threads)

    def _tick(self, interpreters: dict[int, Interpreter]) -> None:
        """Spend this tick's share of the budget: feeders first, then the other threads,
        each group from where the last tick stopped, reading the running ones' frames. The
        work is bounded by the budget, not by the number of threads."""
        now = time.monotonic_ns()
        cap = max(self.period_ns, self.spacing_ns)  # an idle stretch saves no burst up
        self._credit_ns = min(self._credit_ns + self.period_ns, cap)
        allowed = self._credit_ns // self.spacing_ns
        if not allowed:
            return
        self._refresh(interpreters, now)
        feeders = self._feeders.recent(now)
        first = sorted((self._owner[tid], tid) for tid in feeders if tid in self._owner)
        groups = (_from(first, self._turns[0]), _from(self._keys, self._turns[1]))
        looks = allowed * LOOKS_PER_SAMPLE
        taken = 0
        looked = [0, 0]
        for group, keys in enumerate(groups):
            for pid, tid in keys:
                if taken == allowed or sum(looked) == looks:
                    break
                if group and tid in feeders:
                    continue  # looked at already, among the feeders
                looked[group] += 1
                if self._states.running(pid, tid) and self._sample(pid, interpreters[pid], tid):
                    taken += 1
        self._turns = (self._turns[0] + looked[0], self._turns[1] + looked[1])
        self._credit_ns -= taken * self.spacing_ns

    def _sample(self, pid: int, interp: Interpreter, tid: int) -> bool:
        """Read the thread's innermost frame and queue it (False: the read failed)."""
        tstate = self._threads[pid][1][tid]
        ts = time.monotonic_ns()
        try:
            frames = interp.stack(tstate, 1)
        except OSError:
            self.failed_reads += 1
            return False
        top = frames[0] if frames else Frame("", "", 0)
        sample = PySample(ts_ns=ts, tid=tid, tgid=pid, func=top.func, file=top.file, line=top.line)
        with self._lock:
            if len(self._queue) >= QUEUE_MAX:
                self.lost_user += 1
                return True
            self._queue.append(sample)
        return True

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
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        for pid in list(self._threads):
            self._states.keep(pid, set())


SPECS = (
    ProbeSpec(
        name="python_stacks",
        summary="innermost Python frame of running watched threads (CPython 3.10-3.13, "
        "read from outside: 100 samples/s shared by all threads, feeding threads first)",
        default_on=True,
        hooks=(),
        degrades="host work is not named by the Python function that ran",
        factory=PythonStacksProbe,
        thresholds={"period": 10_000_000, "spacing": 10_000_000},
    ),
)
