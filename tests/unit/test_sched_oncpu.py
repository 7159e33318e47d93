"""sched's per-sample on-CPU time (ThreadSched, NodeTime) from the kernel's maps as they change
while the probe reads them: no sample holds more on-CPU time than its length, and the samples
add up to what the switch-outs charged (no stint counted twice, none lost). And an off-CPU
interval still open at a read, announced once (OffCpuOpen)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpujitter.probes.events import NodeTime, OffCpuOpen, ThreadSched
from gpujitter.probes.sched import SPECS, SchedProbe, oncpu_at

TID, TGID = 4242, 4240


@dataclass
class Entry:
    """A `threads` value as sched.bpf.c leaves it (the fields sched.py reads)."""

    tgid: int = TGID
    offcpu_ns: int = 0
    runq_ns: int = 0
    switches: int = 1
    preemptions: int = 0
    migrations: int = 0
    cross_node: int = 0
    exited: int = 0
    oncpu_ns: list[int] = field(default_factory=lambda: [0])
    off_ns: int = 0  # switched out at; 0 while on CPU
    state: int = 1  # STATES[1]: sleeping
    syscall: int = -1


@dataclass
class Slot:
    """A CPU's `running` slot."""

    since_ns: int = 0
    tid: int = 0


class Threads:
    """The `threads` hash as the probe's batch reader gives it (MapBatch.items); `on_read`
    runs as the probe reads it (a switch on another CPU)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.on_read: list[Any] = []

    def items(self) -> list[tuple[int, Entry]]:
        while self.on_read:
            self.on_read.pop(0)()
        return [(tid, Entry(**vars(e))) for tid, e in self.kernel.entries.items()]

    def __delitem__(self, key: Any) -> None:
        del self.kernel.entries[key.value]


class Running:
    """The per-CPU `running` array: a copy of every CPU's slot per lookup."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, key: Any) -> list[Slot]:
        return [Slot(s.since_ns, s.tid) for s in self.kernel.slots]


class Kernel:
    """One watched thread on a two-CPU, one-node machine, changed as sched.bpf.c changes the
    maps at its switches (on-CPU time charged at the switch-out: here the clock's stint)."""

    def __init__(self) -> None:
        self.entries = {TID: Entry()}
        self.slots = [Slot(), Slot()]
        self.since_ns = 0  # the stint in progress began; 0: off CPU
        self.charged_ns = 0
        self.maps = {"threads": Threads(self), "running": Running(self)}

    def __getitem__(self, name: str) -> Any:
        return self.maps[name]

    def switch_in(self, traced: bool = True) -> None:
        self.since_ns = time.monotonic_ns()
        self.entries[TID].off_ns = 0
        if traced:
            self.slots[0] = Slot(self.since_ns, TID)

    def switch_out(self) -> None:
        stint_ns = time.monotonic_ns() - self.since_ns
        self.charged_ns += stint_ns
        self.entries[TID].oncpu_ns[0] += stint_ns
        self.entries[TID].switches += 1
        self.entries[TID].off_ns = time.monotonic_ns()
        self.slots[0] = Slot()
        self.since_ns = 0


def probe_on(kernel: Kernel) -> SchedProbe:
    probe = SchedProbe(SPECS[0])
    probe.bpf = kernel
    probe._threads = kernel.maps["threads"]  # no BPF map to batch-read
    return probe


def oncpu(events: Any) -> list[tuple[int, int]]:
    """(on-CPU ns, interval ns) of the thread's ThreadSched in a sample, checked against its
    NodeTime; (0, 0) when it did nothing."""
    threads = [e for e in events if isinstance(e, ThreadSched)]
    nodes = [e for e in events if isinstance(e, NodeTime)]
    assert sum(ns for e in nodes for _, ns in e.node_ns) == sum(e.oncpu_ns for e in threads)
    return [(e.oncpu_ns, e.interval_ns) for e in threads] or [(0, 0)]


def run_samples(probe: SchedProbe, kernel: Kernel, before: list[Any]) -> list[tuple[int, int]]:
    """One sample per step: each step runs, a millisecond later the tick comes, and the
    probe reads 2 ms after it (the core's refresh and other probes' samples come first)."""
    out = []
    for step in before:
        step()
        time.sleep(0.001)
        tick_ns = time.monotonic_ns()
        time.sleep(0.002)
        out += oncpu(probe.sample(tick_ns))
    return out


def check(samples: list[tuple[int, int]], kernel: Kernel) -> None:
    for ns, interval_ns in samples[1:]:  # the first holds all since the probe was loaded
        assert ns <= interval_ns
    assert sum(ns for ns, _ in samples) == kernel.charged_ns


def nothing() -> None:
    pass


def test_a_switch_out_while_the_maps_are_read_counts_its_stint_once() -> None:
    kernel = Kernel()
    kernel.switch_in()
    probe = probe_on(kernel)
    # the thread is switched out on its CPU while the probe reads `threads`
    read_switch = lambda: kernel["threads"].on_read.append(kernel.switch_out)  # noqa: E731
    samples = run_samples(probe, kernel, [nothing, nothing, read_switch, nothing, nothing])
    check(samples, kernel)


def test_a_stint_ended_between_the_tick_and_the_read_lands_in_the_read_s_sample() -> None:
    kernel = Kernel()
    kernel.switch_in()
    probe = probe_on(kernel)
    samples = run_samples(probe, kernel, [nothing, nothing, nothing])
    time.sleep(0.001)
    tick_ns = time.monotonic_ns()
    time.sleep(0.002)
    kernel.switch_out()  # after the tick, before the read
    samples += oncpu(probe.sample(tick_ns))
    samples += run_samples(probe, kernel, [nothing, nothing])
    check(samples, kernel)


def test_an_untraced_stint_is_spread_over_samples_and_its_exited_thread_kept_till_then() -> None:
    # No running slot: nothing shows the stint until its switch-out (the thread's exit here)
    # charges it whole; the thread is dropped only once all of it is out.
    kernel = Kernel()
    kernel.switch_in(traced=False)
    time.sleep(0.010)  # the part of the stint before the first read tops the next sample
    probe = probe_on(kernel)
    samples = run_samples(probe, kernel, [nothing])
    time.sleep(0.010)

    def exit_thread() -> None:
        kernel.switch_out()
        kernel.entries[TID].exited = 1

    samples += run_samples(probe, kernel, [exit_thread])
    assert TID in kernel.entries  # held: more than one interval's time still to report
    time.sleep(0.030)
    samples += run_samples(probe, kernel, [nothing, nothing])
    check(samples, kernel)
    assert TID not in kernel.entries


def test_a_stint_in_progress_counts_on_its_cpu_s_node_only_where_no_switch_came_between() -> None:
    charged = {7: [100, 0], 8: [5, 5]}
    slots = {1: (7, 1_000), 0: (8, 1_990)}
    assert oncpu_at(charged, slots, dict(slots), 2_000, {0: 0, 1: 1}) == {
        7: [100, 1_000],
        8: [15, 5],
    }
    # CPU 1 switched (7 out, the copy of `threads` may hold its stint): left to the next read
    changed = {1: (9, 1_995), 0: (8, 1_990)}
    assert oncpu_at(charged, slots, changed, 2_000, {0: 0, 1: 1}) == {7: [100, 0], 8: [15, 5]}
    # a stint begun after the stamp has nothing to add yet
    assert oncpu_at(charged, {0: (8, 2_001)}, {0: (8, 2_001)}, 2_000, {}) == charged


def test_an_interval_open_at_a_read_is_announced_once_past_the_threshold() -> None:
    """Announced at the first read where it has lasted the offcpu threshold, with the
    switch-out's stamp (its OffCpu's ts_ns), and not again at later reads; a new interval
    is announced anew; a thread on CPU, or off for less, is not."""
    kernel = Kernel()
    probe = probe_on(kernel)
    probe._open_after = 20 * 1_000_000

    def opened() -> list[OffCpuOpen]:
        return [e for e in probe.sample(time.monotonic_ns()) if isinstance(e, OffCpuOpen)]

    kernel.switch_in()
    assert opened() == []  # on CPU
    kernel.switch_out()
    off_ns = kernel.entries[TID].off_ns
    assert opened() == []  # off for less than the threshold
    time.sleep(0.025)
    first = opened()
    assert [(e.ts_ns, e.tid, e.tgid, e.state) for e in first] == [(off_ns, TID, TGID, "sleeping")]
    assert first[0].as_of_ns - off_ns >= 20 * 1_000_000
    assert opened() == []  # the same interval, still open
    kernel.switch_in()
    kernel.switch_out()
    time.sleep(0.025)
    assert [e.ts_ns for e in opened()] == [kernel.entries[TID].off_ns]
