"""In-kernel log2 histograms, handed on as Log2Hist deltas every HIST_EVERY_NS (the probe set's
runner reads them, probes/runner.py) and once more as the probes stop.

A histogram map is a BPF_PERCPU_ARRAY of one entry, a struct of one u64 array holding one
or more histograms back to back, LOG2_SLOTS slots each, slot `bpf_log2l(v)` counting v
(slot s: [2^(s-1), 2^s), slot 1 also 0). Per-CPU slots need no atomic increments in the
kernel; user space sums the CPUs. One entry, not an entry per slot: the whole set is one
lookup, where the kernel's batch read of an entry per slot took ~0.7 µs a slot (cstate's
1105 slots: 0.8 ms a second on the development VM's 2 CPUs, the more the more CPUs).
"""

from __future__ import annotations

import ctypes as ct
import errno
import time
from collections.abc import Sequence
from typing import Any

from gpujitter.probes.events import Log2Hist

LOG2_SLOTS = 65  # bpf_log2l() returns 1..64
_SLOT_BYTES = 8


class Log2Map:
    """One percpu array entry holding len(names) histograms; `delta` gives what each gained.

    Each histogram's bytes on every CPU are compared with the last read's: only a histogram
    that changed on some CPU is summed across the CPUs, which is the read's Python cost (65
    slots times every CPU: 16 on the H200), and most stay unchanged from one read to the
    next (idle states nobody woke from, GC generations that did not run)."""

    def __init__(self, table: Any, names: Sequence[str], probe: str, now_ns: int = 0) -> None:
        self.names = tuple(names)
        self.probe = probe
        self.table = table
        self.read_ns = now_ns or time.monotonic_ns()  # counted since: the last read, or now
        self._value = table.Leaf()  # the entry on every possible CPU, one after the other
        self._cpus = table.Leaf._length_
        self._stride = ct.sizeof(table.Leaf) // self._cpus  # one CPU's histograms, in bytes
        self._raw = [b""] * len(self.names)  # each histogram's bytes at the last read
        self._last = [[0] * LOG2_SLOTS for _ in self.names]  # and its slots summed

    def delta(self, now_ns: int) -> list[Log2Hist]:
        """What each histogram gained since the last read (or the map's making), read at
        now_ns; none for one that did not change."""
        from bcc.libbcc import lib  # only where a map was loaded: bcc is there

        key = ct.c_uint32(0)
        if lib.bpf_lookup_elem(self.table.map_fd, ct.byref(key), ct.byref(self._value)) != 0:
            err = ct.get_errno()
            raise OSError(err, f"reading {self.probe}'s histograms: {errno.errorcode.get(err)}")
        every = bytes(self._value)
        interval_ns, self.read_ns = now_ns - self.read_ns, now_ns
        span = LOG2_SLOTS * _SLOT_BYTES
        out = []
        for i, name in enumerate(self.names):
            starts = range(i * span, len(every), self._stride)
            rows = [every[at : at + span] for at in starts]
            raw = b"".join(rows)
            if raw == self._raw[i]:
                continue  # no CPU counted anything new in it
            self._raw[i] = raw
            per_cpu = [memoryview(row).cast("Q").tolist() for row in rows]
            counts = list(map(sum, zip(*per_cpu, strict=True)))
            last = self._last[i]
            self._last[i] = counts
            buckets = tuple(
                (1 << (slot - 1), counts[slot] - last[slot])
                for slot in range(1, LOG2_SLOTS)
                if counts[slot] > last[slot]
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
        return out
