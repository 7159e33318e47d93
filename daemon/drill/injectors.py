"""The feeding thread's side of each drill scenario: what it does in its critical path during
an injected stall (inject), what it prepares or cleans up while the GPU is busy (background,
bounded to a fraction of a step so that it never idles the GPU itself), and what it sets up
before the loop starts (setup), and what it starts once the probes watch (start: a process
forked then is watched too, as the kernel follows forks of watched processes). Runs inside
the feeder process (feeder.py); the system state around it (swap, cgroups, IRQ affinity,
helper processes) is the drill's (scenarios.py).

inject() returns facts about the stall for the truth record; "cause_ns" in it, where
present, is the loop's own measure of the injected cause's time when that is not the whole
stall (time stolen from a spinning loop, wake-up lateness).
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import gc
import mmap
import multiprocessing
import os
import queue
import struct
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

from gpujitter.daemon.drill.helpers import die_with_parent
from gpujitter.probes import registry
from gpujitter.probes.faults import STORM_READ_EVERY

PAGE = mmap.PAGESIZE
MB = 1 << 20
SPIN_LOST_NS = 1_000  # a step between two clock reads longer than this is time lost
PREEMPTED_NS = 1_000_000  # ... and this much longer: the thread was switched out
PR_SET_TIMERSLACK = 29
PR_SET_NAME = 15
BATCH_TIMEOUT_S = 30  # beyond the stall itself: the loader's worker is gone


def load_inject(path: str) -> ct.CDLL:
    lib = ct.CDLL(path)
    u64 = ct.c_uint64
    lib.gj_touch_until.restype = u64
    lib.gj_touch_until.argtypes = [ct.c_void_p, u64, u64, ct.c_int, u64]
    lib.gj_storm_until.restype = u64
    lib.gj_storm_until.argtypes = [ct.c_void_p, u64, u64, u64, u64, u64, ct.POINTER(u64)]
    lib.gj_spin_until.restype = u64
    lib.gj_spin_until.argtypes = [u64, u64, ct.POINTER(u64)]
    lib.gj_sleep_until.restype = u64
    lib.gj_sleep_until.argtypes = [u64, u64, ct.POINTER(u64)]
    return lib


def spin(lib: ct.CDLL, deadline_ns: int) -> dict[str, int]:
    """Spin until the deadline: the time lost to interrupts (and the hypervisor) while
    running, and the time it was preempted."""
    preempted = ct.c_uint64(0)
    lost = lib.gj_spin_until(deadline_ns, SPIN_LOST_NS, preempted)
    return {"lost_ns": lost, "preempted_ns": preempted.value}


def address(m: mmap.mmap) -> int:
    """Where a (writable) mapping starts; the ctypes view is dropped at once so that the
    mapping can still be closed."""
    view = (ct.c_char * len(m)).from_buffer(m)
    try:
        return ct.addressof(view)
    finally:
        del view


class Injector:
    """No injection: the control."""

    name: ClassVar[str] = "clean"
    # inject() only sets the stall up; it happens inside the synchronisation that follows
    # (feeder.stall_in_sync), not after it.
    inside_sync: ClassVar[bool] = False

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        self.lib = lib
        self.stall_ns = stall_ns
        self.params = params

    def setup(self) -> dict[str, Any]:
        return {}

    def start(self) -> None:
        return None

    def background(self) -> None:
        return None

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


class AttachBusy(Injector):
    """No injection either: the probes attach while the loop already feeds (prefeed)."""

    name = "attach-busy"


class Compute(Injector):
    """A CPU-bound host step: spin until the deadline."""

    name = "compute"

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        return spin(self.lib, deadline_ns)


class Migrate(Injector):
    """Moved to a CPU of another NUMA node (params remote_cpu) and made to work there, then
    back home: on-CPU time remote from the GPU, after a cross-node migration."""

    name = "migrate"

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        home = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.params["remote_cpu"]})
        there = time.monotonic_ns()
        facts = spin(self.lib, deadline_ns)
        left = time.monotonic_ns()
        os.sched_setaffinity(0, home)
        return {"cause_ns": left - there, **facts}


class Trigger(Injector):
    """Wakes a helper process through a pipe (params trigger_fd) with the stall's deadline,
    then spins until it: a helper that takes the feeder's CPU (contention) leaves it nothing
    to spin; one that raises interrupts on it (irq) leaves gaps in its clock readings, whose
    sum, where the thread was not switched out, is the time the interrupts stole (the
    cause's truth; in a VM it holds the hypervisor's share too)."""

    name = "trigger"
    measure_lost = False

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        os.write(self.params["trigger_fd"], struct.pack("<Q", deadline_ns))
        facts: dict[str, Any] = spin(self.lib, deadline_ns)
        if self.measure_lost:
            facts["cause_ns"] = facts["lost_ns"]
        return facts


class Contention(Trigger):
    name = "contention"


class SyncContention(Injector):
    """Wakes the hog (params trigger_fd) with the stall's deadline, which it spins until
    from a little before the GPU's queue drains: it lands while the feeding thread sleeps in
    the synchronisation, and keeps it waiting on the run queue after the drain woke it."""

    name = "sync-contention"
    inside_sync = True

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        os.write(self.params["trigger_fd"], struct.pack("<Q", deadline_ns))
        return {}


class SyncSpin(SyncContention):
    """The same hog, landing while the feeding thread spins in the synchronisation (the
    stub's spinning mode): it is preempted, not woken, and sees the drain once it runs."""

    name = "sync-spin"


class SyncLate(SyncContention):
    """The hog, woken once the step's work is queued and before the synchronisation is
    called (as the H200 real job's was): it preempts the feeding thread outside any CUDA
    call, at once where it runs SCHED_FIFO, else at the scheduler's next chance, which the
    thread waits for here (on the CPU, bounded by the deadline). When the thread runs again
    the queue has drained and its synchronisation returns at once."""

    name = "sync-late"

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        facts = super().inject(deadline_ns)
        before = time.monotonic_ns()
        while (now := time.monotonic_ns()) < deadline_ns and now - before < PREEMPTED_NS:
            before = now
        return facts


class Irq(Trigger):
    name = "irq"
    measure_lost = True


class IdleWakeups(Injector):
    """Short sleeps until the deadline, each leaving the feeder's CPU idle and waking the
    thread onto it again (params sleep_us). The cause's truth is the summed lateness of the
    wake-ups as the loop sees it (an upper bound of the wake-to-run delays: it also holds the
    timer interrupt's own latency)."""

    name = "cstate"

    def setup(self) -> dict[str, Any]:
        # The default 50 us timer slack would be most of every wake-up's lateness.
        libc = ct.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ct.c_ulong(1), 0, 0, 0)
        return {}

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        wakes = ct.c_uint64(0)
        late = self.lib.gj_sleep_until(deadline_ns, self.params["sleep_us"] * 1000, wakes)
        return {"cause_ns": late, "wakes": wakes.value}


class MinorFaultStorm(Injector):
    """Writes one byte of each page of a fresh mapping of a shared-memory file whose pages
    are all in memory, until the deadline: one minor fault per page, each mapping a page
    (as a data loader's shared-memory batch is mapped by the process that reads it). The
    pages are made before the loop starts, not at the faults: in a VM that hands its free
    memory back to the host, the first touch of a fresh anonymous page took 150-650 us at
    times (the host backing it), most of a storm. The probe times a storm by stretches of
    STORM_READ_EVERY faults and counts, not times, one slower than its default `storm_gap`
    a fault or holding a switch: the cause's truth is the stall less what it ran in those.
    The rule is the probe's own, not the scenario's set-up, so a job that injects without
    the drill's stage (bench/train_job.py) measures the same. A stall's mapping is unmapped
    in pieces while the GPU is busy (the pages stay in the file)."""

    name = "faults"
    RELEASE_BYTES = 16 * MB  # unmapped per step

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.fd = -1
        self.fresh: mmap.mmap | None = None
        self.used: deque[tuple[mmap.mmap, int]] = deque()  # (mapping, bytes still mapped)
        # Read here, not in the stall: the registry's first read loads every probe's spec.
        self.storm_gap_ns = registry.get("faults").thresholds["storm_gap"]

    def _region_bytes(self) -> int:
        # Generous: even at 0.5 us per fault a stall touches less than this.
        return max(64 * MB, self.stall_ns // 500 * PAGE)

    def setup(self) -> dict[str, Any]:
        size = self._region_bytes()
        self.fd = os.memfd_create("gj-drill-faults", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        with mmap.mmap(self.fd, size) as pages:
            self.lib.gj_touch_until(address(pages), size, PAGE, 1, 1 << 63)
        return {}

    def background(self) -> None:
        if self.fresh is None:
            self.fresh = mmap.mmap(self.fd, self._region_bytes())
            self.fresh.madvise(mmap.MADV_NOHUGEPAGE)
            return
        if self.used:
            region, mapped = self.used[0]
            piece = min(self.RELEASE_BYTES, mapped)
            region.madvise(mmap.MADV_DONTNEED, mapped - piece, piece)
            if mapped - piece:
                self.used[0] = (region, mapped - piece)
            else:
                self.used.popleft()
                region.close()

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        region = self.fresh
        if region is None:
            return {"short": True}
        self.fresh = None
        untimed = ct.c_uint64(0)
        t0 = time.monotonic_ns()
        touched = self.lib.gj_storm_until(
            address(region), len(region), PAGE, deadline_ns, STORM_READ_EVERY,
            self.storm_gap_ns, untimed,
        )  # fmt: skip
        t1 = time.monotonic_ns()
        self.used.append((region, -(-touched // PAGE) * PAGE))
        return {
            "pages": touched // PAGE,
            "short": touched >= len(region),
            "untimed_ns": untimed.value,
            "cause_ns": max(0, t1 - t0 - untimed.value),
        }

    def close(self) -> None:
        for region, _ in self.used:
            region.close()
        if self.fresh is not None:
            self.fresh.close()
        if self.fd >= 0:
            os.close(self.fd)


class FileFaults(Injector):
    """Reads, one byte a page, a file mapped after its page cache was dropped (params file):
    one major fault per page, each a read from the disk (MADV_RANDOM: no read-around)."""

    name = "filefaults"

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.fd = os.open(params["file"], os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        self.mapping: mmap.mmap | None = None
        self.stale = True  # the current mapping was read: drop and map again

    def background(self) -> None:
        if not self.stale:
            return
        if self.mapping is not None:
            self.mapping.close()
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        # Private and writable only so that ctypes can take its address; it is only read.
        self.mapping = mmap.mmap(self.fd, self.size, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE)  # fmt: skip
        self.mapping.madvise(mmap.MADV_RANDOM)
        self.stale = False

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        if self.mapping is None or self.stale:
            return {"short": True}
        self.stale = True
        read = self.lib.gj_touch_until(address(self.mapping), self.size, PAGE, 0, deadline_ns)
        return {"pages": read // PAGE, "short": read >= self.size}

    def close(self) -> None:
        if self.mapping is not None:
            self.mapping.close()
        os.close(self.fd)


def runq_ns() -> int:
    """The calling thread's time in the run queue so far (schedstat: brought up to date each
    time the thread gets a CPU, so current here)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1])


def busy_ns() -> int:
    """The calling thread's time on a CPU and in the run queue so far: the on-CPU part from
    its CPU clock (schedstat's lags by up to a tick while the thread runs)."""
    return time.thread_time_ns() + runq_ns()


def blocked_read(fd: int, buffer: bytearray, deadline_ns: int) -> dict[str, Any]:
    """Reads fd into buffer until the deadline, from its start again at its end; the truth
    is the thread's blocked time in it: the stall less its on-CPU and run-queue time (the
    reads' own CPU, copying the pages out and issuing the I/O, is host work)."""
    busy0, t0 = busy_ns(), time.monotonic_ns()
    read = 0
    while time.monotonic_ns() < deadline_ns:
        n = os.readv(fd, [buffer])
        if n == 0:  # the end of the file: on from its start
            os.lseek(fd, 0, os.SEEK_SET)
        read += n
    elapsed = time.monotonic_ns() - t0
    return {"cause_ns": max(0, elapsed - (busy_ns() - busy0)), "bytes": read}


class SequentialRead(Injector):
    """Reads a file (params file) on from where the last stall stopped, params chunk_bytes a
    read(), its page cache dropped at every step, from a cgroup that throttles the disk
    (params cgroup, where there is one): the kernel reads ahead and the thread sleeps
    uninterruptibly until the disk completes the window it reached. The truth is the
    thread's blocked time in the stall (blocked_read)."""

    name = "readahead"

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.fd = os.open(params["file"], os.O_RDONLY)
        # One buffer for every read: a fresh 1 MiB object per read would be an mmap and a
        # munmap each (the allocator's, seen by the malloc probe).
        self.buffer = bytearray(params.get("chunk_bytes", MB))

    def setup(self) -> dict[str, Any]:
        if "cgroup" in self.params:  # the disk's read throttle
            Path(self.params["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
        return {}

    def background(self) -> None:
        # Every step: what the last stall read ahead is still under I/O for a while after it,
        # and the kernel drops only pages that are not.
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        return blocked_read(self.fd, self.buffer, deadline_ns)

    def close(self) -> None:
        os.close(self.fd)


class SwapIns(Injector):
    """Joins a memory cgroup capped below a buffer it then fills (params cgroup,
    buffer_bytes), so that the buffer's oldest pages go out to swap; each stall reads on
    from where the last one stopped, one byte a page: one swap-in per page."""

    name = "swap"

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.buffer: mmap.mmap | None = None
        self.pos = 0

    def setup(self) -> dict[str, Any]:
        Path(self.params["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
        self.buffer = mmap.mmap(-1, self.params["buffer_bytes"])
        self.buffer.madvise(mmap.MADV_NOHUGEPAGE)
        t0 = time.monotonic_ns()
        base = address(self.buffer)
        self.lib.gj_touch_until(base, len(self.buffer), PAGE, 1, 1 << 63)
        return {"fill_ns": time.monotonic_ns() - t0}

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        assert self.buffer is not None
        left = len(self.buffer) - self.pos
        read = self.lib.gj_touch_until(address(self.buffer) + self.pos, left, PAGE, 0,
                                       deadline_ns)  # fmt: skip
        self.pos += -(-read // PAGE) * PAGE
        return {"pages": read // PAGE, "short": read >= left}

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()


class AllocatorStall(Injector):
    """Gives back large touched blocks (munmap, as glibc's free does for big chunks) until
    the deadline. The blocks are mapped populated (MAP_POPULATE: no page faults) while the GPU
    is busy, a chunk per step, until the pool holds twice what a stall takes (the munmap rate
    is measured at setup)."""

    name = "malloc"
    CHUNK_BYTES = 8 * MB
    CALIBRATE_CHUNKS = 8

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.pool: deque[mmap.mmap] = deque()
        self.target = self.CHUNK_BYTES

    def _chunk(self, size: int) -> mmap.mmap:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
        return mmap.mmap(-1, size, flags=flags)

    def setup(self) -> dict[str, Any]:
        # The fastest of a few chunk-sized munmaps: a pool sized on a slow one ran out
        # before the deadline (stalls of 16-18 ms for 25 ms on the development VM).
        fastest = None
        for _ in range(self.CALIBRATE_CHUNKS):
            block = self._chunk(self.CHUNK_BYTES)
            t0 = time.monotonic_ns()
            block.close()
            took = max(1, time.monotonic_ns() - t0)
            fastest = took if fastest is None else min(fastest, took)
        ns_per_byte = (fastest or 1) / self.CHUNK_BYTES
        self.target = int(2 * self.stall_ns / ns_per_byte) + self.CHUNK_BYTES
        return {"munmap_ns_per_mb": round(ns_per_byte * MB), "pool_bytes": self.target}

    def background(self) -> None:
        if len(self.pool) * self.CHUNK_BYTES < self.target:
            self.pool.append(self._chunk(self.CHUNK_BYTES))

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        # The truth is the munmaps' own time: on a busy machine the thread also waits to run
        # between and inside them, which is the run queue's (measured here), not theirs.
        waited, t0 = runq_ns(), time.monotonic_ns()
        calls = 0
        while self.pool and time.monotonic_ns() < deadline_ns:
            self.pool.popleft().close()
            calls += 1
        t1 = time.monotonic_ns()
        waited = runq_ns() - waited
        return {"cause_ns": max(0, t1 - t0 - waited), "munmaps": calls,
                "bytes": calls * self.CHUNK_BYTES, "short": t1 < deadline_ns}  # fmt: skip

    def close(self) -> None:
        for block in self.pool:
            block.close()


def _name_thread(name: str) -> None:
    """The calling thread's comm, so that attributions name it."""
    ct.CDLL(None).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


def _loader_worker(lib: ct.CDLL, cpus: list[int], index_q: Any, result_q: Any, feeder: int) -> None:
    """A data-loader worker process: for each batch (a deadline on its index queue) it
    computes, CPU-bound, until the deadline, and puts what it measured on its result queue
    (a multiprocessing queue: its own feeder thread writes it to the pipe)."""
    die_with_parent(feeder)
    _name_thread("gj-loader-wkr")
    os.sched_setaffinity(0, cpus)
    # The queue's feeder thread starts on the first put: put one now, as a real loader's
    # first batch does, so that the thread exists through the stalls' waits (a waker that
    # did not exist yet explains nothing of the wait before it).
    result_q.put({})
    while (deadline := index_q.get()) is not None:
        t0, cpu0 = time.monotonic_ns(), time.thread_time_ns()
        facts = spin(lib, deadline)
        cpu_ns = time.thread_time_ns() - cpu0
        result_q.put({"compute_ns": time.monotonic_ns() - t0, "cpu_ns": cpu_ns, **facts})
    result_q.put(None)
    result_q.close()
    result_q.join_thread()


def _pin_memory(result_q: Any, data_q: queue.Queue[Any]) -> None:
    """The intermediate thread (PyTorch's pin-memory thread): takes each batch off the
    workers' queue and hands it to the feeding thread's in-process queue."""
    _name_thread("gj-loader-pin")
    while True:
        batch = result_q.get()
        data_q.put(batch)
        if batch is None:
            return


class Loader(Injector):
    """A DataLoader without torch: the feeding thread asks a worker process for a batch
    (through a multiprocessing index queue) and waits on an in-process queue that an
    intermediate thread fills from the worker's result queue; the worker, forked once the
    probes watch (so it is watched), computes each batch until the stall's deadline (params
    worker_cpus: where it runs). The cause's truth is the worker's CPU time while it computed
    (the kernel's count for the thread: its compute time less every wait to run; the spin
    loop's own count of its preemptions, kept beside it, missed a 15 ms one under load);
    the stall record names the worker's pid (culprit_tgid)."""

    name = "loader"

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.ctx = multiprocessing.get_context("fork")
        self.index_q: Any = None
        self.worker: Any = None
        self.data_q: queue.Queue[Any] = queue.Queue()

    def start(self) -> None:
        self.index_q = self.ctx.Queue()
        result_q = self.ctx.Queue()
        self.worker = self.ctx.Process(
            target=_loader_worker,
            args=(self.lib, self.params["worker_cpus"], self.index_q, result_q, os.getpid()),
            daemon=True,
        )
        self.worker.start()
        threading.Thread(target=_pin_memory, args=(result_q, self.data_q), daemon=True).start()
        self._batch()  # the worker's first (empty) batch: it is up

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        self.index_q.put(deadline_ns)
        batch = self._batch()
        return {
            "cause_ns": batch["cpu_ns"],
            "compute_ns": batch["compute_ns"],
            "worker_lost_ns": batch["lost_ns"],
            "worker_preempted_ns": batch["preempted_ns"],
            "culprit_tgid": self.worker.pid,
        }

    def _batch(self) -> Any:
        """The next batch; a worker that died or hangs ends the loop with a message."""
        try:
            return self.data_q.get(timeout=BATCH_TIMEOUT_S + self.stall_ns / 1e9)
        except queue.Empty:
            raise SystemExit(f"loader: no batch from the worker in {BATCH_TIMEOUT_S} s") from None

    def close(self) -> None:
        if self.worker is None:
            return
        self.index_q.put(None)
        self.worker.join(timeout=5)
        if self.worker.is_alive():
            self.worker.kill()
            self.worker.join()


class GcCollections(Injector):
    """Full CPython GC collections in the step: set-up builds a heap of long-lived
    containers big enough that one full collection takes about GC_SHARE of the stall (at
    least GC_MIN_NS: the collector traverses all of it); each stall then drops a little
    cyclic garbage and collects generation 2, again until the deadline, as a job that calls
    gc.collect() in its step. The truth is the collections' time as gc.callbacks see it in
    this process (the probe watches from outside)."""

    name = "gc"
    GC_SHARE = 0.45
    GC_MIN_NS = 10_000_000
    CHUNK = 20_000  # containers added to the heap per calibration round
    MAX_CONTAINERS = 20_000_000  # ~2 GB of lists: a slower machine gets shorter collections
    CYCLES = 2_000  # cyclic garbage dropped before each collection

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.heap: list[list[Any]] = []
        self._gc_ns = 0
        self._t0 = 0
        self._full = 0  # generation-2 collections (the garbage also sets off young ones)

    def _timer(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.monotonic_ns()
        else:
            self._gc_ns += time.monotonic_ns() - self._t0
            self._full += info["generation"] == 2

    def setup(self) -> dict[str, Any]:
        target = max(self.GC_MIN_NS, round(self.stall_ns * self.GC_SHARE))
        full_ns = 0
        while full_ns < target and len(self.heap) < self.MAX_CONTAINERS:
            self.heap += [[{}] for _ in range(self.CHUNK)]
            t0 = time.monotonic_ns()
            gc.collect()
            full_ns = time.monotonic_ns() - t0
        gc.callbacks.append(self._timer)
        return {"heap_containers": 2 * len(self.heap), "full_collection_ns": full_ns}

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        self._gc_ns = self._full = 0
        while time.monotonic_ns() < deadline_ns:
            for _ in range(self.CYCLES):
                cycle: list[Any] = []
                cycle.append(cycle)
            del cycle
            gc.collect(2)
        return {"cause_ns": self._gc_ns, "full_collections": self._full}

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._timer)
        # a job trains on after the scenario: its own collections must not traverse this heap
        self.heap = []


class GilHolder(Injector):
    """A background Python thread of the feeder's process (gj-drill-gil) holds the GIL in a
    pure-Python loop for the stall, while the feeding thread does small I/O (os.stat), which
    releases the GIL and takes it back each call: each take waits for the interpreter's
    forced switch (5 ms). The holder runs on params["holder_cpus"], not the feeder's CPU,
    so the waits are the GIL's, not the run queue's. The truth is the time the feeding
    thread's calls took, as it timed them."""

    name = "gil"

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self._go = threading.Event()
        self._deadline_ns = 0  # the holder's: -1 to end it
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._hold, daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        _name_thread("gj-drill-gil")
        os.sched_setaffinity(0, set(self.params["holder_cpus"]))
        while self._go.wait() and self._deadline_ns >= 0:
            self._go.clear()
            n = 0
            while time.monotonic_ns() < self._deadline_ns:
                n += 1

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        self._deadline_ns = deadline_ns
        self._go.set()
        waited = calls = 0
        while (t0 := time.monotonic_ns()) < deadline_ns:
            os.stat("/")
            waited += time.monotonic_ns() - t0
            calls += 1
        return {"cause_ns": waited, "calls": calls}

    def close(self) -> None:
        self._deadline_ns = -1
        self._go.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def pyhot_step(deadline_ns: int) -> int:
    """The pyhot drill's hot function: pure Python arithmetic until the deadline (the
    innermost Python frame throughout: what it calls is C)."""
    total = 0
    while time.monotonic_ns() < deadline_ns:
        for i in range(64):
            total += i * i
    return total


class PyHot(Injector):
    """A pure-Python function in the step (pyhot_step) that runs the whole stall; the facts
    name it as its code object does, for the drill to compare with the frames sampled."""

    name = "pyhot"

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        pyhot_step(deadline_ns)
        code = pyhot_step.__code__
        return {"func": code.co_qualname, "file": code.co_filename, "line": code.co_firstlineno}


INJECTORS: dict[str, type[Injector]] = {
    cls.name: cls
    for cls in (
        Injector,
        AttachBusy,
        Compute,
        Migrate,
        Contention,
        SyncContention,
        SyncSpin,
        SyncLate,
        Irq,
        IdleWakeups,
        MinorFaultStorm,
        FileFaults,
        SequentialRead,
        SwapIns,
        AllocatorStall,
        Loader,
        GcCollections,
        GilHolder,
        PyHot,
    )
}
