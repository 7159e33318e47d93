"""malloc: allocator stalls. Default mode traces the allocator's system calls (mmap, munmap,
brk, madvise, mremap) of watched processes through syscalls tracepoints; calls slower than
the `syscall` threshold (default 100 us) are streamed, all calls land in in-kernel log2
latency histograms.
"""

from __future__ import annotations

from typing import Any

from gpujitter.probes.base import BpfProbe
from gpujitter.probes.events import AllocSyscall
from gpujitter.probes.registry import Hook, ProbeSpec

SYSCALLS = ("mmap", "munmap", "brk", "madvise", "mremap")  # index = SC_* in malloc.bpf.c


class MallocProbe(BpfProbe):
    source = "malloc.bpf.c"
    rings = ("slow_syscalls",)

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


SPECS = (
    ProbeSpec(
        name="malloc",
        summary="allocator system calls (mmap/munmap/brk/madvise/mremap) with latency",
        default_on=True,
        hooks=tuple(
            Hook("tracepoint", f"syscalls:sys_{edge}_{sc}")
            for sc in SYSCALLS
            for edge in ("enter", "exit")
        ),
        degrades="allocator stalls are not attributed (they show as on-CPU or blocked time)",
        factory=MallocProbe,
        thresholds={"syscall": 100_000},
    ),
)
