"""In-kernel log2 histograms read once a second and handed on as Log2Hist deltas.

A histogram map is a BPF_PERCPU_ARRAY of u64 holding one or more histograms back to back,
LOG2_SLOTS slots each, slot `bpf_log2l(v)` counting v (slot s: [2^(s-1), 2^s), slot 1 also
0). Per-CPU slots need no atomic increments in the kernel; user space sums the CPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpujitter.probes.events import Log2Hist

LOG2_SLOTS = 65  # bpf_log2l() returns 1..64


class Log2Map:
    """One percpu array holding len(names) histograms; `delta` gives what each gained."""

    def __init__(self, table: Any, names: Sequence[str], probe: str) -> None:
        self.table = table
        self.names = tuple(names)
        self.probe = probe
        self._last = [0] * (LOG2_SLOTS * len(self.names))

    def totals(self) -> list[int]:
        counts = [0] * len(self._last)
        for key, per_cpu in self.table.items_lookup_batch():
            if int(key) < len(counts):
                counts[int(key)] = sum(per_cpu)
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
