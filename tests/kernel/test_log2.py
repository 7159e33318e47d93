"""The per-CPU histogram reader (probes/log2.py Log2Map) against bcc's own reading of a real
per-CPU array entry: each histogram's gain, summed over every possible CPU, and nothing for
a histogram that did not change; and the runner's cadence for them (every HIST_EVERY_NS and
at the stop, not at every tick)."""

from __future__ import annotations

import ctypes as ct
import subprocess
import sys
import time

from gpujitter.probes.events import Log2Hist
from gpujitter.probes.log2 import LOG2_SLOTS, Log2Map
from gpujitter.probes.runner import HIST_EVERY_NS, ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

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
        hists = Log2Map(table, ["a", "b"], "test", now_ns=1_000)
        first = hists.delta(now_ns=2_000)
        # "a": slots 0-64, "b": 65-129; slot s of a histogram counts [2^(s-1), 2^s)
        assert [(h.name, h.buckets) for h in first] == [
            (name, tuple((1 << (s - 1), sums[base + s]) for s in range(1, LOG2_SLOTS)
                         if sums[base + s]))
            for name, base in (("a", 0), ("b", LOG2_SLOTS))
        ]  # fmt: skip
        assert first[0].buckets[0] == (4, 4 * sum(cpu + 7 for cpu in range(cpus)))
        assert {(h.ts_ns, h.interval_ns) for h in first} == {(1_000, 1_000)}  # since its making
        assert hists.delta(now_ns=3_000) == []
        # one more count in the last CPU's slot 10 of "b": "b" alone, by that one count
        value[cpus - 1].n[LOG2_SLOTS + 10] += 1
        table[zero] = value
        # each read counts from the last one, an unchanged read too
        assert [(h.name, h.buckets, h.ts_ns, h.interval_ns) for h in hists.delta(now_ns=4_000)] == [
            ("b", ((1 << 9, 1),), 3_000, 1_000)
        ]
    finally:
        bpf.cleanup()


def test_the_runner_hands_the_histograms_on_every_ten_seconds_and_at_the_stop() -> None:
    """Nothing in the daemon reads them: a tick (once a second) leaves them in the kernel,
    a tick HIST_EVERY_NS after the last read hands on what they gained since, and so does
    the stop's, whenever it comes."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.005)"])
    events: list = []
    try:
        watch = WatchSpec(pids={sleeper.pid})
        with ProbeSet(["sched"], topology=load_topology(nvml=False), watch=watch,
                      emit=events.append) as probes:  # fmt: skip
            probes.start()
            started = time.monotonic_ns()

            def ticked(at_ns: int, final: bool = False) -> list[Log2Hist]:
                time.sleep(0.1)  # the sleeper's 5 ms sleeps: offcpu.sleeping counts them
                events.clear()
                probes.tick(at_ns, final=final)
                return [e for e in events if isinstance(e, Log2Hist)]

            assert ticked(started + 1_000_000_000) == []
            assert ticked(started + HIST_EVERY_NS // 2) == []
            tenth = [h for h in ticked(started + HIST_EVERY_NS) if h.name == "offcpu.sleeping"]
            assert len(tenth) == 1, tenth
            assert tenth[0].ts_ns + tenth[0].interval_ns == started + HIST_EVERY_NS
            assert sum(n for _, n in tenth[0].buckets) >= 15  # ~40 sleeps in 0.2 s
            assert ticked(started + HIST_EVERY_NS + 1_000_000_000) == []
            last = ticked(started + HIST_EVERY_NS + 2_000_000_000, final=True)
            assert [h.interval_ns for h in last if h.name == "offcpu.sleeping"] == [2_000_000_000]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert HIST_EVERY_NS == 10_000_000_000
