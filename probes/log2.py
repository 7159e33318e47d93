"""In-kernel log2 histograms read once a second and handed on as Log2Hist deltas.

A histogram map is a BPF_PERCPU_ARRAY of u64 holding one or more histograms back to back,
LOG2_SLOTS slots each, slot `bpf_log2l(v)` counting v (slot s: [2^(s-1), 2^s), slot 1 also
0). Per-CPU slots need no atomic increments in the kernel; user space sums the CPUs.
"""

from __future__ import annotations

import ctypes as ct
import errno
from collections.abc import Sequence
from typing import Any

from gpujitter.probes.events import Log2Hist

LOG2_SLOTS = 65  # bpf_log2l() returns 1..64


class PerCpuSums:
    """A BPF per-CPU array of u64 read whole by batch lookups into buffers allocated once,
    each entry summed across CPUs. bcc's items_lookup_batch allocates max_entries keys and
    values on every call and builds a ctypes object per entry: read once a second for each
    histogram map, that was most of the probe thread's time (docs/performance.md)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        count = table.max_entries
        self._keys = (table.Key * count)()
        self._values = (table.Leaf * count)()
        self._cpus = table.Leaf._length_
        self._flat = memoryview(self._values).cast("B").cast("Q")  # entry-major, u64 each
        self._key_ints = memoryview(self._keys).cast("B").cast("I")  # an array's keys: u32

    def sums(self) -> dict[int, int]:
        """Entry index -> its value summed over every possible CPU."""
        from bcc.libbcc import lib  # only where a map was loaded: bcc is there

        size, key_size, value_size = (
            len(self._keys),
            ct.sizeof(self.table.Key),
            ct.sizeof(self.table.Leaf),
        )
        batch, got, total = ct.c_uint32(0), ct.c_uint32(0), 0
        while total < size:
            got.value = size - total
            res = lib.bpf_lookup_batch(
                self.table.map_fd,
                ct.byref(batch) if total else None,
                ct.byref(batch),
                ct.byref(self._keys, key_size * total),
                ct.byref(self._values, value_size * total),
                ct.byref(got),
            )
            err = ct.get_errno()
            total += got.value
            if res != 0:
                if err != errno.ENOENT:
                    raise OSError(err, f"BPF_MAP_LOOKUP_BATCH failed: {errno.errorcode.get(err)}")
                break  # the end of the map
            if got.value == 0:
                break
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
