"""Whole-map reads of a BPF map by batch lookups (BPF_MAP_LOOKUP_BATCH) into key and value
buffers allocated once per map, for the maps read every second or more often (the log2
histograms, irq's windows)."""

from __future__ import annotations

import ctypes as ct
import errno
from typing import Any


class MapBatch:
    """A BPF map read whole by batch lookups into buffers allocated once. bcc's
    items_lookup_batch allocates max_entries keys and values on every call (irq's window
    map: 32768 entries, ~1.7 MB zeroed per read, 0.5 ms, ten reads a second) and builds a
    ctypes object per entry: read every second or more often, that was most of the probe
    thread's time (docs/performance.md)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        count = table.max_entries
        self.keys = (table.Key * count)()
        self.values = (table.Leaf * count)()

    def read(self) -> int:
        """Fill `keys` and `values` with the map's entries; returns how many there are."""
        from bcc.libbcc import lib  # only where a map was loaded: bcc is there

        size, key_size, value_size = (
            len(self.keys),
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
                ct.byref(self.keys, key_size * total),
                ct.byref(self.values, value_size * total),
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
        return total
