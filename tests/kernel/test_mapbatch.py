"""The batch reader of BPF maps (probes/mapbatch.py) against bcc's own batch lookup of a real
hash map: read whole, and a buffer-full at a time through buffers smaller than the map
(sched's thread map), the same entries in the same order."""

from __future__ import annotations

import ctypes as ct

from gpujitter.probes.mapbatch import MapBatch

SOURCE = """
struct entry { u64 ns; u32 tgid; char comm[16]; };
BPF_HASH(threads, u32, struct entry, 4096);
int unused(void *ctx) { return 0; }
"""


def test_reads_in_small_buffers_give_bccs_entries_in_bccs_order() -> None:
    from bcc import BPF

    bpf = BPF(text=SOURCE)
    try:
        table = bpf["threads"]
        for tid in range(1, 2500, 3):  # 833 entries: several buffer-fulls of 64
            table[ct.c_uint(tid)] = table.Leaf(tid * 1000, tid // 7, b"t%d" % tid)

        def rows(items: object) -> list[tuple[int, int, int, bytes]]:
            return [(k, v.ns, v.tgid, bytes(v.comm)) for k, v in items]  # type: ignore[attr-defined]

        expected = rows(table.items_lookup_batch())
        assert len(expected) == 833
        assert rows(MapBatch(table, entries=64).items()) == expected
        assert rows(MapBatch(table).items()) == expected
        whole = MapBatch(table)
        count = whole.read()
        assert rows(zip(whole.keys[:count], whole.values[:count], strict=True)) == expected
        # Copies, not views of the reused buffer: what one read gave outlives the next.
        kept = list(MapBatch(table, entries=64).items())
        assert rows(kept) == expected
    finally:
        bpf.cleanup()
