"""malloc probe, cheap mode: glibc large allocations go through mmap/munmap, and the probe
must report each one of the watched process with its length and latency, whether the call
comes through libc or not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

from gpujitter.probes.events import AllocSyscall, Log2Hist
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from tests.kernel.conftest import run_probes

# Allocations above glibc's mmap threshold (128 KiB by default) are served by mmap and
# returned by munmap; touching every page makes munmap free real memory.
LARGE_ALLOCS = textwrap.dedent("""
    import ctypes, sys, time
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    sys.stdin.readline()              # wait until the probes watch us
    for _ in range({n}):
        p = libc.malloc({size})
        ctypes.memset(p, 1, {size})
        libc.free(p)
""")


def allocating_child(n: int, size: int) -> tuple[subprocess.Popen[str], Callable[[], None]]:
    """A process that makes n malloc/free pairs of `size` bytes once `load()` releases it."""
    child = subprocess.Popen(
        [sys.executable, "-c", LARGE_ALLOCS.format(n=n, size=size)],
        stdin=subprocess.PIPE,
        text=True,
    )

    def load() -> None:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0

    return child, load


def test_glibc_large_allocations_are_seen_as_mmap_and_munmap() -> None:
    n, size = 20, 32 << 20
    child, load = allocating_child(n, size)
    rec = run_probes(
        ["malloc"], load, watch=WatchSpec(pids={child.pid}), thresholds={"malloc": {"syscall": 0}}
    )

    mine = rec.of(AllocSyscall, tgid=child.pid)
    maps = [e for e in mine if e.syscall == "mmap" and e.length >= size]
    unmaps = [e for e in mine if e.syscall == "munmap" and e.length >= size]
    assert len(maps) == n
    assert len(unmaps) == n
    # munmap of 32 MiB of touched memory frees 8192 pages: it is never free of cost.
    assert min(e.dur_ns for e in unmaps) > 10_000
    assert all(e.tid == child.pid for e in mine)  # single-threaded child
    assert rec.status("malloc").lost_kernel == 0


def test_threshold_filters_fast_calls_in_the_kernel_and_the_histograms_count_them() -> None:
    n = 20  # 32 MiB: glibc's mmap threshold never rises that far, each is an mmap and munmap
    child, load = allocating_child(n, 32 << 20)
    rec = run_probes(
        ["malloc"],
        load,
        watch=WatchSpec(pids={child.pid}),
        thresholds={"malloc": {"syscall": 10_000_000_000}},
    )
    assert rec.of(AllocSyscall, tgid=child.pid) == []
    assert rec.status("malloc").state == "running"
    # None streamed, every one counted: the interpreter's own mappings after the watch
    # began come on top of the loop's n pairs, never in place of them.
    hists = rec.of(Log2Hist, probe="malloc")
    calls = {
        name: sum(count for h in hists if h.name == name for _, count in h.buckets)
        for name in ("mmap", "munmap")
    }
    assert n <= calls["mmap"] < n + 500
    assert n <= calls["munmap"] < n + 500


def test_a_call_displaced_from_its_slot_is_counted_lost() -> None:
    """The calls in flight are kept in an array slot by thread id modulo GJ_MAX_THREADS: a
    thread whose id shares the slot of another's call in flight (ids 65536 apart; the
    development VM's pid_max, 32768, makes none, so the other call is written in) takes it,
    that call is counted lost, once, and the thread's own calls are timed in it."""
    n, size = 5, 32 << 20  # above glibc's dynamic mmap threshold: each an mmap and munmap
    child, load = allocating_child(n, size)
    events: list[object] = []
    with ProbeSet(
        ["malloc"],
        topology=load_topology(),
        watch=WatchSpec(pids={child.pid}),
        emit=events.append,
        thresholds={"malloc": {"syscall": 0}},
    ) as probes:
        assert all(s.state == "running" for s in probes.start())
        probe = probes.probes[0]
        inflight = probe.bpf["inflight"]
        slots = inflight.max_entries  # a power of two: the slot is the id's low bits
        slot = inflight.Key(child.pid % slots)
        other = inflight.Leaf(ts_ns=time.monotonic_ns(), length=4096, tid=child.pid + slots)
        inflight[slot] = other
        load()
        probes.poll()
        mine = inflight[slot]
        assert mine.tid == child.pid
        assert probe.status(time.monotonic_ns()).lost_kernel == 1
    # the thread's own calls were timed in the slot it took, each released
    timed = [e for e in events if isinstance(e, AllocSyscall) and e.tid == child.pid]
    assert sum(e.syscall == "mmap" and e.length >= size for e in timed) == n
    assert sum(e.syscall == "munmap" and e.length >= size for e in timed) == n


def test_unwatched_processes_are_filtered_out() -> None:
    child, load = allocating_child(5, 1 << 20)
    rec = run_probes(
        ["malloc"], load, watch=WatchSpec(pids={1}), thresholds={"malloc": {"syscall": 0}}
    )
    assert rec.of(AllocSyscall, tgid=child.pid) == []


# The calls made as raw system calls, as a static binary, a Go runtime or an allocator with
# its own system-call stubs makes them: no libc wrapper on the way.
RAW_CALLS = textwrap.dedent("""
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    sys.stdin.readline()
    for _ in range({n}):
        addr = libc.syscall(9, None, ctypes.c_size_t({size}), 3, 0x22, -1, 0)  # mmap
        ctypes.memset(addr, 1, {size})
        assert libc.syscall(11, ctypes.c_void_p(addr), ctypes.c_size_t({size})) == 0  # munmap
""")


def test_raw_system_calls_that_bypass_libc_are_seen() -> None:
    n, size = 10, 16 << 20
    child = subprocess.Popen(
        [sys.executable, "-c", RAW_CALLS.format(n=n, size=size)], stdin=subprocess.PIPE, text=True
    )

    def load() -> None:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0

    rec = run_probes(
        ["malloc"], load, watch=WatchSpec(pids={child.pid}), thresholds={"malloc": {"syscall": 0}}
    )
    mine = rec.of(AllocSyscall, tgid=child.pid)
    assert len([e for e in mine if e.syscall == "mmap" and e.length == size]) == n
    assert len([e for e in mine if e.syscall == "munmap" and e.length == size]) == n
