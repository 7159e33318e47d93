"""The per-CPU histogram reader (probes/log2.py Log2Map) against bcc's own reading of a real
per-CPU array entry: each histogram's gain, summed over every possible CPU, and nothing for
a histogram that did not change."""

from __future__ import annotations

import ctypes as ct

from gpujitter.probes.log2 import LOG2_SLOTS, Log2Map

SOURCE = f"""
struct hists {{ u64 n[{2 * LOG2_SLOTS}]; }};
BPF_PERCPU_ARRAY(hists, struct hists, 1);
int unused(void *ctx) {{ return 0; }}
"""


def test_gains_match_bccs_reading_and_an_unchanged_histogram_gives_none() -> None:
    from bcc import BPF

    bpf = BPF(text=SOURCE)
    try:
        table = bpf["hists"]
        cpus = table.Leaf._length_
        zero = ct.c_int(0)
        value = table.Leaf()
        for slot in range(0, 2 * LOG2_SLOTS, 3):  # every third slot, a count on each CPU
            for cpu in range(cpus):
                value[cpu].n[slot] = (slot + 1) * (cpu + 7)
        table[zero] = value
        sums = [sum(table[zero][cpu].n[slot] for cpu in range(cpus))
                for slot in range(2 * LOG2_SLOTS)]  # fmt: skip
        hists = Log2Map(table, ["a", "b"], "test")
        first = hists.delta(now_ns=2_000, interval_ns=1_000)
        # "a": slots 0-64, "b": 65-129; slot s of a histogram counts [2^(s-1), 2^s)
        assert [(h.name, h.buckets) for h in first] == [
            (name, tuple((1 << (s - 1), sums[base + s]) for s in range(1, LOG2_SLOTS)
                         if sums[base + s]))
            for name, base in (("a", 0), ("b", LOG2_SLOTS))
        ]  # fmt: skip
        assert first[0].buckets[0] == (4, 4 * sum(cpu + 7 for cpu in range(cpus)))
        assert hists.delta(now_ns=3_000, interval_ns=1_000) == []
        # one more count in the last CPU's slot 10 of "b": "b" alone, by that one count
        value[cpus - 1].n[LOG2_SLOTS + 10] += 1
        table[zero] = value
        assert [(h.name, h.buckets) for h in hists.delta(now_ns=4_000, interval_ns=1_000)] == [
            ("b", ((1 << 9, 1),))
        ]
    finally:
        bpf.cleanup()
