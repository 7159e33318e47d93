"""The per-CPU histogram reader (probes/log2.py PerCpuSums) against bcc's own reading of a
real per-CPU array: every entry, summed over every possible CPU, the same."""

from __future__ import annotations

import ctypes as ct

from gpujitter.probes.log2 import LOG2_SLOTS, Log2Map, PerCpuSums

SOURCE = f"""
BPF_PERCPU_ARRAY(hists, u64, {2 * LOG2_SLOTS});
int unused(void *ctx) {{ return 0; }}
"""


def test_sums_match_bccs_reading_of_a_per_cpu_array() -> None:
    from bcc import BPF

    bpf = BPF(text=SOURCE)
    try:
        table = bpf["hists"]
        cpus = table.Leaf._length_
        for key in range(0, 2 * LOG2_SLOTS, 3):  # every third entry, a value on each CPU
            table[ct.c_int(key)] = table.Leaf(*((key + 1) * (cpu + 7) for cpu in range(cpus)))
        expected = {int(k): sum(v) for k, v in table.items_lookup_batch()}
        assert PerCpuSums(table).sums() == expected
        assert expected[3] == sum(4 * (cpu + 7) for cpu in range(cpus))
        per_cpu = sum(cpu + 7 for cpu in range(cpus))
        hists = Log2Map(table, ["a", "b"], "test").delta(now_ns=2_000, interval_ns=1_000)
        # "a": entries 0-64, first set one 3 (slot 3: [4, 8)); "b": 65-129, first set 66 (slot 1)
        assert [(h.name, h.buckets[0]) for h in hists] == [("a", (4, 4 * per_cpu)),
                                                           ("b", (1, 67 * per_cpu))]  # fmt: skip
    finally:
        bpf.cleanup()
