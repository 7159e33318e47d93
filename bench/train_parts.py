"""The parts of the real training job (bench/train_job.py) that need no PyTorch: its token
data (a large memory-mapped file that the DataLoader's workers random-crop), the ring
through which the job holds a chosen batch in its worker (the slow-worker scenario), the
injections it adds to the drills' ones, and the registry of its stall scenarios.

    python3 -P -m bench.train_parts swapper CGROUP BYTES   (started by the job: see SharedSwapIns)
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import mmap
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpujitter.daemon.drill.injectors import (
    INJECTORS,
    PAGE,
    Injector,
    MinorFaultStorm,
    SwapIns,
    blocked_read,
)

MB = 1 << 20
MS = 1_000_000
EOS = 0  # the token that ends a document
HOLD_SLOTS = 4096  # batches the hold ring tells apart (far more than are ever in flight)
READ_CHUNK_BYTES = 1 * MB


def make_tokens(path: Path, tokens: int, vocab: int, seed: int = 0) -> np.memmap:
    """A file of `tokens` uint16 token ids (Zipf-like, documents ended by EOS), written once
    in chunks and mapped read-only; an existing file of the right size is reused."""
    want = tokens * 2
    if not (path.exists() and path.stat().st_size == want):
        rng = np.random.default_rng(seed)
        out = np.memmap(path, dtype=np.uint16, mode="w+", shape=(tokens,))
        chunk = 1 << 24
        for start in range(0, tokens, chunk):
            n = min(chunk, tokens - start)
            # a heavy head and a long tail, as in text; ~1 in 400 tokens ends a document
            ids = (rng.pareto(1.1, n) * 40).astype(np.int64) % (vocab - 1) + 1
            ids[rng.random(n) < 1 / 400] = EOS
            out[start : start + n] = ids
        out.flush()
        del out
    return np.memmap(path, dtype=np.uint16, mode="r", shape=(tokens,))


class HoldRing:
    """Shared between the job and its DataLoader workers (an anonymous shared mapping,
    inherited when the workers fork): the job marks a batch to hold before a worker starts
    it; the worker computes on it until the job, about to wait for that batch, posts a
    release time (CLOCK_MONOTONIC ns) and that time has passed."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 2 * 8 * HOLD_SLOTS)
        arr = np.frombuffer(self._map, dtype=np.int64)
        self.hold = arr[:HOLD_SLOTS]
        self.release = arr[HOLD_SLOTS:]

    def mark(self, batch: int) -> None:
        slot = batch % HOLD_SLOTS
        self.release[slot] = 0
        self.hold[slot] = batch + 1

    def post(self, batch: int, release_ns: int) -> None:
        self.release[batch % HOLD_SLOTS] = release_ns

    def held(self, batch: int) -> bool:
        return bool(self.hold[batch % HOLD_SLOTS] == batch + 1)

    def clear(self, batch: int) -> None:
        self.hold[batch % HOLD_SLOTS] = 0

    def wait_released(self, batch: int, work: Callable[[], None]) -> int:
        """In a worker: run `work` (real computation) until the batch is released; returns
        the time spent (ns)."""
        t0 = time.monotonic_ns()
        slot = batch % HOLD_SLOTS
        while True:
            release = int(self.release[slot])
            if release and time.monotonic_ns() >= release:
                return time.monotonic_ns() - t0
            work()


class TokenBatches:
    """A map-style dataset whose item i is batch i (the DataLoader runs with batch_size=None,
    so each worker builds whole batches and knows their index): `batch` windows of seq+1
    tokens cropped at pseudo-random offsets of the token file, remapped through a vocabulary
    permutation (a stand-in for tokenisation), with per-token positions restarting after
    each end of document. Returns (inputs, targets, positions) as int64 arrays."""

    def __init__(self, tokens: np.memmap, batch: int, seq: int, vocab: int, ring: HoldRing):
        self.tokens = tokens
        self.batch = batch
        self.seq = seq
        self.ring = ring
        self.remap = np.random.default_rng(1).permutation(vocab).astype(np.int64)
        self.remap[EOS] = EOS

    def __len__(self) -> int:
        return 1 << 40

    def offsets(self, index: int) -> np.ndarray:
        rng = np.random.default_rng(index)
        return rng.integers(0, len(self.tokens) - self.seq - 1, self.batch)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = np.stack([self.tokens[o : o + self.seq + 1] for o in self.offsets(index)])
        ids = self.remap[rows.astype(np.int64)]
        if self.ring.held(index):
            self.ring.wait_released(index, lambda: self._busy(ids))
        x, y = ids[:, :-1], ids[:, 1:]
        return np.ascontiguousarray(x), np.ascontiguousarray(y), positions(x)

    def _busy(self, ids: np.ndarray) -> None:
        # ~0.1-0.5 ms of arithmetic on the batch: a worker stuck in its own computation
        np.cumsum(ids * 2654435761 % 1000003, axis=1)


def positions(x: np.ndarray) -> np.ndarray:
    """Each token's position in its document: counting from 0 after every EOS."""
    idx = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    # a document starts after an EOS: the EOS itself is its own document's last token
    after_eos = np.where(x == EOS, idx + 1, 0)
    starts = np.zeros_like(after_eos)
    starts[:, 1:] = after_eos[:, :-1]
    return (idx - np.maximum.accumulate(starts, axis=1)).astype(np.int64)


# -- injections of the job's own (the drills' come from daemon/drill/injectors.py) ---------


class Sleep(Injector):
    """A host stall: the step sleeps until the deadline (off CPU, a timed sleep)."""

    name = "sleep"

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        time.sleep(max(0, deadline_ns - time.monotonic_ns()) / 1e9)
        return {}


class ReadAhead(Injector):
    """Reads a file (params file) sequentially, 1 MiB a read(), after dropping its page
    cache: the kernel's read-ahead, and the thread blocked on the disk. The cache is dropped
    again while the GPU is busy after each stall. The truth is the thread's blocked time, as
    the readahead drill's (blocked_read): the reads' own CPU is host work."""

    name = "readahead"

    def __init__(self, lib: ct.CDLL, stall_ns: int, params: dict[str, Any]) -> None:
        super().__init__(lib, stall_ns, params)
        self.fd = os.open(params["file"], os.O_RDONLY)
        self.buf = bytearray(READ_CHUNK_BYTES)
        self.stale = True

    def background(self) -> None:
        if self.stale:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            self.stale = False

    def inject(self, deadline_ns: int) -> dict[str, Any]:
        self.stale = True
        os.lseek(self.fd, 0, os.SEEK_SET)
        return blocked_read(self.fd, self.buf, deadline_ns)

    def close(self) -> None:
        os.close(self.fd)


class SharedSwapIns(SwapIns):
    """Swap-ins without capping the job's own memory: a helper process in a memory cgroup
    capped below a shared memory file (memfd) fills the file, so that most of it goes out
    to swap; the job maps the same file and each stall reads on through it, one byte a page
    (params cgroup, buffer_bytes, from the drills' swap set-up: a swap file, the cgroup,
    vm.page-cluster=0). The swapped pages stay charged to the helper's cgroup; the stalls
    read as the drill's do (SwapIns)."""

    def setup(self) -> dict[str, Any]:
        import subprocess

        size = int(self.params["buffer_bytes"])
        t0 = time.monotonic_ns()
        helper = subprocess.Popen(
            [sys.executable, "-P", "-m", "bench.train_parts", "swapper",
             str(self.params["cgroup"]), str(size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert helper.stdout is not None and helper.stdin is not None
        line = helper.stdout.readline().split()
        if len(line) != 2 or line[0] != "ready":
            helper.kill()
            raise RuntimeError(f"the swap helper did not start (exit {helper.wait()})")
        fd = os.open(f"/proc/{helper.pid}/fd/{line[1]}", os.O_RDWR)
        try:
            self.buffer = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        helper.stdin.close()  # the file lives on in this mapping; the helper may go
        helper.wait()
        return {"fill_ns": time.monotonic_ns() - t0, "buffer_bytes": size}


def swapper(cgroup: str, size: int) -> None:
    """The swap helper: joins the capped cgroup, fills a memfd of `size` bytes (the pages
    beyond the cap go out to swap), says `ready FD` and waits for its stdin to close."""
    Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    fd = os.memfd_create("gj-realjob-swap")
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size) as m:
        np.frombuffer(m, dtype=np.uint8)[::PAGE] = 1  # one write a page: every page backed
    print("ready", fd, flush=True)
    sys.stdin.read()


# -- the job's scenarios (swap last: its set-up is the one that can take long) -------------

# Where in the step a scenario's stall happens.
AFTER_SYNC = "after_sync"  # the injector runs right after loss.item() (the GPU's queue empty)
LOADER = "loader"  # the next batch is held in its worker: the step waits in next()
IN_SYNC = "in_sync"  # a hog takes the thread's CPU while it waits in torch.cuda.synchronize()


@dataclass(frozen=True, slots=True)
class JobScenario:
    name: str
    summary: str
    cause: str  # the cause the injection is (records.CAUSES)
    truth: str  # what the job measures as that cause's time
    where: str  # AFTER_SYNC, LOADER or IN_SYNC
    injector: type[Injector] | None = None  # AFTER_SYNC: what runs in the stall
    drill_stage: str = ""  # the drill scenario whose set-up (helpers, swap, files) it needs


JOB_SCENARIOS: dict[str, JobScenario] = {
    s.name: s
    for s in (
        JobScenario("sleep", "the step sleeps (a host stall)", "blocked", "the stall",
                    AFTER_SYNC, Sleep),
        JobScenario("compute", "a CPU-bound host step", "host_work", "the stall",
                    AFTER_SYNC, INJECTORS["compute"]),
        JobScenario("contention", "a hog (SCHED_FIFO, else nice -20) on the training thread's "
                    "CPU while it works", "runq_wait", "the stall", AFTER_SYNC,
                    INJECTORS["contention"], "contention"),
        JobScenario("migrate", "moved to another CPU of the same node and working there",
                    "host_work", "the time on the other CPU", AFTER_SYNC, INJECTORS["migrate"]),
        JobScenario("faults", "a page-fault storm: first touch of a fresh mapping of in-memory "
                    "pages", "minor_faults", "the stall less what the probe's storm rule leaves "
                    "untimed", AFTER_SYNC, MinorFaultStorm),
        JobScenario("readahead", "reads a file after dropping its page cache", "io_wait",
                    "the stall's blocked time", AFTER_SYNC, ReadAhead),
        JobScenario("loader", "a DataLoader worker computes on the next batch until released",
                    "host_work", "the step's wait for the batch", LOADER),
        JobScenario("sync", "a hog lands on the thread's CPU while it waits in "
                    "torch.cuda.synchronize()", "runq_wait",
                    "GPU done (CUDA event) to the sync's return", IN_SYNC, None, "contention"),
        # the Python runtime's causes (issue 14), in the job's own training thread
        JobScenario("gc", "full CPython collections over a heap grown until one takes ~45 % "
                    "of the stall", "gc_pause", "the collections (gc.callbacks)", AFTER_SYNC,
                    INJECTORS["gc"]),
        JobScenario("gil", "a Python thread of the job holds the GIL in a pure-Python loop "
                    "while the training thread does small I/O (needs +python_gil)", "gil_wait",
                    "the training thread's GIL-releasing calls (timed by itself)", AFTER_SYNC,
                    INJECTORS["gil"], "gil"),
        JobScenario("pyhot", "a pure-Python function runs the whole stall in the step",
                    "host_work", "the stall", AFTER_SYNC, INJECTORS["pyhot"]),
        JobScenario("swap", "swap-ins: reads through a shared file that a cgroup-capped "
                    "helper filled", "swap_in", "the stall", AFTER_SYNC, SharedSwapIns, "swap"),
    )
}  # fmt: skip


def data_file(folder: Path, size_bytes: int) -> Path:
    """A file of real data blocks for the read-ahead scenario (written once)."""
    from gpujitter.daemon.drill.system import write_file

    path = folder / "readahead.bin"
    if not (path.exists() and path.stat().st_size >= size_bytes):
        write_file(path, size_bytes)
    return path


def close_quietly(injector: Injector | None) -> None:
    if injector is not None:
        with contextlib.suppress(OSError):
            injector.close()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "swapper":
        swapper(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: python3 -P -m bench.train_parts swapper CGROUP BYTES")
