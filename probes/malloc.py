"""malloc: allocator stalls, in two modes.

Cheap (default): the allocator's system calls (mmap, munmap, brk, madvise, mremap) of
watched processes, timed by the mm lock they take (mmap_lock raw tracepoints, malloc.bpf.c);
calls slower than the `syscall` threshold (default 100 us) are streamed, and every call lands
in an in-kernel log2 latency histogram, handed on each second as a Log2Hist named after its
system call ("mmap", "munmap", ...). No syscall tracepoint: enabling one sends every system
call of every task on the node down the kernel's traced path (bench/syscall_tracing.py).

Precise (opt-in, per process, for a bounded window): uprobes on the allocator entry points
each chosen process maps (malloc_precise.py); calls slower than the `call` threshold
(default 100 us) are streamed as AllocCall. Options, under ProbeContext.options["malloc"]:
    precise_pids: [pid, ...]          processes to time (none: the mode stays off)
    precise_window_ns: 30_000_000_000 how long before the uprobes detach themselves
"""

from __future__ import annotations

import platform
import time
from typing import Any

from gpujitter.probes import contract, uprobe_multi
from gpujitter.probes.base import BpfProbe, ProbeContext, ProbeUnavailable
from gpujitter.probes.events import AllocSyscall
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.malloc_precise import PreciseWindow
from gpujitter.probes.progstats import program_fds
from gpujitter.probes.registry import Hook, ProbeSpec

SYSCALLS = ("mmap", "munmap", "brk", "madvise", "mremap")
# Their numbers, which the kernel leaves in the caller's saved registers (orig_ax).
SYSCALL_NR = {"x86_64": {"mmap": 9, "munmap": 11, "brk": 12, "madvise": 28, "mremap": 25}}
# what the .bpf.c gets as -D options
CONSTANTS = {
    **contract.indexes("SC", SYSCALLS),
    **{f"NR_{name.upper()}": nr for name, nr in SYSCALL_NR["x86_64"].items()},
}
DEFAULT_WINDOW_NS = 30_000_000_000


class MallocProbe(BpfProbe):
    bpf_file = "malloc.bpf.c"
    rings = ("slow_syscalls",)
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.precise: PreciseWindow | None = None
        self._hists: Log2Map | None = None

    def start(self, ctx: ProbeContext) -> None:
        if platform.machine() not in SYSCALL_NR:
            raise ProbeUnavailable(f"system call numbers of {platform.machine()} not known")
        super().start(ctx)
        self._hists = Log2Map(self.bpf["latency_log2"], SYSCALLS, self.name)
        opts = ctx.options.get(self.name, {})
        pids = opts.get("precise_pids") or ()
        if not pids:
            return
        self.precise = PreciseWindow(
            pids,
            window_ns=opts.get("precise_window_ns", DEFAULT_WINDOW_NS),
            threshold_ns=self.threshold(ctx, "call"),
            deliver=self.deliver,
            linked=uprobe_multi.wanted(opts),
        )
        try:
            self.reason = self.precise.start()
        except ProbeUnavailable as err:
            self.reason = f"precise mode unavailable: {err}"

    def decode(self, ring: str, rec: Any) -> AllocSyscall:
        return AllocSyscall(
            ts_ns=rec.ts_ns,
            dur_ns=rec.dur_ns,
            tid=rec.tid,
            tgid=rec.tgid,
            cpu=rec.cpu,
            syscall=SYSCALLS[rec.sc],  # type: ignore[arg-type]
            length=rec.length,
            ret=rec.ret,
        )

    def log2_maps(self) -> list[Log2Map]:
        """Every call's latency per system call, handed on as Log2Hist named after it."""
        return [self._hists] if self._hists is not None else []

    def poll(self) -> None:
        super().poll()
        if self.precise is not None:
            now = time.monotonic_ns()
            if self.precise.poll(now):
                self.reason = self.precise.summary(now)
                self._emit(self.status(now))

    def due_ns(self) -> int | None:
        """The precise window's end: it closes at a poll, on time."""
        return self.precise.deadline_ns if self.precise is not None and self.precise.open else None

    def lost_kernel(self) -> int:
        precise = self.precise.lost_kernel() if self.precise is not None else 0
        return super().lost_kernel() + precise

    def programs(self) -> list[int]:
        precise = program_fds(self.precise.bpf) if self.precise is not None else []
        return super().programs() + precise

    def close(self) -> None:
        if self.precise is not None and self.precise.open:
            self.precise.close()
            self.reason = self.precise.summary(time.monotonic_ns())
        super().close()


SPECS = (
    ProbeSpec(
        name="malloc",
        summary="allocator system calls with latency (by the mm lock they take); allocator "
        "calls (opt-in uprobes)",
        default_on=True,
        hooks=(
            Hook("tracepoint", "mmap_lock:mmap_lock_start_locking"),
            Hook("tracepoint", "mmap_lock:mmap_lock_released"),
            # precise mode only (opt-in); the allocator each process maps, glibc here
            Hook("uprobe", "libc:malloc", optional=True),
        ),
        degrades="allocator stalls are not attributed (they show as on-CPU or blocked time)",
        factory=MallocProbe,
        thresholds={"syscall": 100_000, "call": 100_000},
    ),
)
