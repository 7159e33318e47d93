"""Trace write and read cost: events per second and bytes per event for typical kinds.

.venv/bin/python -m bench.trace_io [N]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from gpujitter.daemon.sinks.trace import TraceHeader, TraceReader, TraceWriter
from gpujitter.probes.events import AllocSyscall, Event, IrqStolen, OffCpu
from gpujitter.probes.topology import load_topology


def typical(i: int) -> Event:
    """A mix like a busy node's stream: off-CPU intervals, IRQ time, allocator calls."""
    if i % 3 == 0:
        return OffCpu(
            ts_ns=i * 1000, end_ns=i * 1000 + 2_500_000, tid=4000 + i % 32, tgid=4000, cpu=i % 16,
            cpu_in=(i + 1) % 16, state="sleeping", runnable_ns=i * 1000 + 2_000_000,
            waker_tid=4001, syscall=202, other_tid=812, other_comm="kworker/3:1",
            comm="pt_data_worker",
        )  # fmt: skip
    if i % 3 == 1:
        return IrqStolen(
            ts_ns=i * 1000, end_ns=i * 1000 + 40_000, tid=4000, tgid=4000, cpu=3,
            irq_kind="hardirq", irq=36, name="nvme0q3", count=4, total_ns=38_000,
        )  # fmt: skip
    return AllocSyscall(
        ts_ns=i * 1000, dur_ns=180_000, tid=4003, tgid=4000, cpu=5, syscall="munmap",
        length=64 << 20, ret=0,
    )  # fmt: skip


def main(n: int) -> None:
    events = [typical(i) for i in range(n)]
    header = TraceHeader.now(load_topology(), ["sched", "irq", "malloc"], {})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.gjtrace"
        start = time.perf_counter()
        with TraceWriter(path, header) as writer:
            for ev in events:
                writer.write(ev)
        write_s = time.perf_counter() - start
        size = path.stat().st_size
        start = time.perf_counter()
        with TraceReader(path) as reader:
            count = sum(1 for _ in reader)
        read_s = time.perf_counter() - start
    assert count == n
    print(f"events            {n}")
    print(f"bytes per event   {size / n:.0f}")
    print(f"write             {n / write_s / 1e3:.0f}k events/s ({write_s / n * 1e6:.2f} us each)")
    print(f"read              {n / read_s / 1e3:.0f}k events/s ({read_s / n * 1e6:.2f} us each)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300_000)
