"""Whole-map reads of a BPF map by batch lookups (BPF_MAP_LOOKUP_BATCH) into key and value
buffers allocated once per map, for the maps read every second or more often (irq's
per-CPU totals, sched's threads)."""

from __future__ import annotations

import ctypes as ct
import errno
from collections.abc import Iterator
from typing import Any


class MapBatch:
    """A BPF map read whole by batch lookups into buffers allocated once. bcc's
    items_lookup_batch allocates max_entries keys and values on every call (irq's window
    map: 32768 entries, ~1.7 MB zeroed per read, 0.5 ms, ten reads a second; sched's thread
    map: 65536 entries of 112 bytes and more, ~7.6 MB a read) and builds a ctypes object per entry:
    read every second or more often, that was most of the probe thread's time
    (docs/performance.md). `entries` sizes the buffers below the map's size for a map read
    through `items` (a buffer-full at a time)."""

    def __init__(self, table: Any, entries: int = 0) -> None:
        self.table = table
        count = min(entries, table.max_entries) if entries > 0 else table.max_entries
        self.keys = (table.Key * count)()
        self.values = (table.Leaf * count)()

    def read(self) -> int:
        """Fill `keys` and `values` with the map's entries; returns how many there are."""
        batch, total = ct.c_uint32(0), 0
        while total < len(self.keys):
            got, more = self._lookup(batch, total, len(self.keys) - total)
            total += got
            if not more or got == 0:
                break
        return total

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every entry as (key, value), in the kernel's order (bucket by bucket, as one read
        into buffers of the map's size gives them), read a buffer-full at a time; a struct
        is copied out of the buffer, which the next lookup reuses."""
        batch = ct.c_uint32(0)
        first = True
        while True:
            got, more = self._lookup(batch, 0, len(self.keys), resume=not first)
            first = False
            for i in range(got):
                key, value = self.keys[i], self.values[i]
                yield _copied(key), _copied(value)
            if not more or got == 0:
                return

    def _lookup(
        self, batch: ct.c_uint32, offset: int, count: int, resume: bool | None = None
    ) -> tuple[int, bool]:
        """One BPF_MAP_LOOKUP_BATCH of up to `count` entries into the buffers at `offset`,
        from the token `batch` (from the map's start when not resuming: by default, when
        offset is 0); returns how many came and whether entries remain."""
        from bcc.libbcc import lib  # only where a map was loaded: bcc is there

        got = ct.c_uint32(count)
        key_size, value_size = ct.sizeof(self.table.Key), ct.sizeof(self.table.Leaf)
        res = lib.bpf_lookup_batch(
            self.table.map_fd,
            ct.byref(batch) if (offset > 0 if resume is None else resume) else None,
            ct.byref(batch),
            ct.byref(self.keys, key_size * offset),
            ct.byref(self.values, value_size * offset),
            ct.byref(got),
        )
        err = ct.get_errno()
        if res != 0 and err != errno.ENOENT:
            raise OSError(err, f"BPF_MAP_LOOKUP_BATCH failed: {errno.errorcode.get(err)}")
        return got.value, res == 0  # ENOENT: the end of the map


def _copied(item: Any) -> Any:
    """A buffer's element as a value of its own (ctypes gives simple types as ints)."""
    return type(item).from_buffer_copy(item) if isinstance(item, ct.Structure | ct.Array) else item


class PerCpuSum:
    """One entry of a per-CPU array of integers, summed over the CPUs, read into a buffer
    allocated once: bcc's `table[key]` builds the per-CPU value and a list of it at every
    read (a lost counter, read once a second by every probe: 13-14 µs that way, ~9 µs this
    way on the H200 and the development VM, bench/probe_thread.py)."""

    def __init__(self, table: Any, key: int = 0) -> None:
        self.table = table
        self._key = table.Key(key)
        self._value = table.Leaf()  # the entry on every possible CPU, one after the other

    def read(self) -> int:
        from bcc.libbcc import lib  # only where a map was loaded: bcc is there

        fd = self.table.map_fd
        if lib.bpf_lookup_elem(fd, ct.byref(self._key), ct.byref(self._value)) != 0:
            err = ct.get_errno()
            raise OSError(err, f"reading a per-CPU counter: {errno.errorcode.get(err)}")
        return sum(self._value)
