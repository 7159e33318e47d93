"""In-kernel log2 histograms read once a second and handed on as Log2Hist deltas.

A histogram map is a BPF_PERCPU_ARRAY of u64 holding one or more histograms back to back,
LOG2_SLOTS slots each, slot `bpf_log2l(v)` counting v (slot s: [2^(s-1), 2^s), slot 1 also
0). Per-CPU slots need no atomic increments in the kernel; user space sums the CPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpujitter.probes.events import Log2Hist
from gpujitter.probes.mapbatch import MapBatch

LOG2_SLOTS = 65  # bpf_log2l() returns 1..64


class PerCpuSums:
    """A BPF per-CPU array of u64 read whole (MapBatch), each entry summed across CPUs."""

    def __init__(self, table: Any) -> None:
        self._batch = MapBatch(table)
        self._cpus = table.Leaf._length_
        # entry-major, u64 each; an array's keys are u32
        self._flat = memoryview(self._batch.values).cast("B").cast("Q")
        self._key_ints = memoryview(self._batch.keys).cast("B").cast("I")

    def sums(self) -> dict[int, int]:
        """Entry index -> its value summed over every possible CPU."""
        total = self._batch.read()
        # Whole lists and one zip that groups each entry's CPUs: no ctypes object or
        # memoryview slice per entry (a row per CPU: 16 on the H200).
        values = iter(self._flat[: total * self._cpus].tolist())
        rows = zip(*[values] * self._cpus, strict=True)
        return dict(zip(self._key_ints[:total].tolist(), map(sum, rows), strict=True))


class Log2Map:
    """One percpu array holding len(names) histograms; `delta` gives what each gained."""

    def __init__(self, table: Any, names: Sequence[str], probe: str) -> None:
        self.table = table
        self.names = tuple(names)
        self.probe = probe
        self._last = [0] * (LOG2_SLOTS * len(self.names))
        self._reader = PerCpuSums(table)

    def totals(self) -> list[int]:
        counts = [0] * len(self._last)
        for key, total in self._reader.sums().items():
            if key < len(counts):
                counts[key] = total
        return counts

    def delta(self, now_ns: int, interval_ns: int) -> list[Log2Hist]:
        counts = self.totals()
        out = []
        for i, name in enumerate(self.names):
            base = i * LOG2_SLOTS
            buckets = tuple(
                (1 << (slot - 1), counts[base + slot] - self._last[base + slot])
                for slot in range(1, LOG2_SLOTS)
                if counts[base + slot] > self._last[base + slot]
            )
            if buckets:
                out.append(
                    Log2Hist(
                        ts_ns=now_ns - interval_ns,
                        interval_ns=interval_ns,
                        probe=self.probe,
                        name=name,
                        buckets=buckets,
                    )
                )
        self._last = counts
        return out
