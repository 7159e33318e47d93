"""irq probe on the real kernel: the virtio disk IRQ pinned to a watched thread's CPU while
direct I/O makes it fire; busy watched threads taking timer ticks and IPIs. What the probe
reports is checked against the kernel's own counters in /proc/interrupts. How windows reach
user space (queued once they reach the threshold, evicted by the LRU otherwise) is checked
with windows written into the probe's maps."""

from __future__ import annotations

import ctypes as ct
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpujitter.probes import irq as irq_probe
from gpujitter.probes.events import CpuStats, Event, IrqStolen, ProbeStatus
from gpujitter.probes.host import HostPaths, format_cpulist, parse_cpulist
from gpujitter.probes.interrupts import read_table
from gpujitter.probes.irq import IrqProbe, delete_keys
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec
from tests.kernel.conftest import Recorded, run_probes

DISK_IRQ_NAME = "virtio1-req.0"
CPU = max(os.sched_getaffinity(0))  # where the tests pin their workers (the disk IRQ too)
EVERY_WINDOW = {"irq": {"stolen": 0}}
# The vectors' programs: one pair for all, told apart by the attachment's cookie (where the
# kernel passes one, as here), or a pair compiled per vector (older kernels).
SHARED = pytest.mark.parametrize("shared", [True, False], ids=["one-pair", "pair-per-vector"])


def vectors(shared: bool) -> dict[str, dict[str, Any]]:
    return {"irq": {"tp_cookies": shared}}


BLOCK = 4096

# Workers pin themselves to one CPU and, with a real-time priority, own it (but for the 5 %
# that RT throttling leaves to others): what the probe sees there is then theirs to lose,
# whatever else runs on this shared machine.
PIN = """
import os
os.sched_setaffinity(0, {{{cpu}}})
if {rt}:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({rt}))
"""

SPIN = PIN + textwrap.dedent("""
    import sys, time
    sys.stdin.readline()
    end = time.monotonic() + {seconds}
    while time.monotonic() < end:
        pass
""")

# Reads `n` distinct 4 KiB blocks with O_DIRECT: each read is a request the disk completes
# with an interrupt (the page cache is bypassed), one at a time.
DIRECT_READS = PIN + textwrap.dedent("""
    import mmap, sys
    fd = os.open({path!r}, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, {block})
    sys.stdin.readline()
    for i in range({n}):
        assert os.preadv(fd, [buf], i * {block}) == {block}
""")


def disk_irq() -> int:
    for row in read_table(HostPaths()).values():
        if row.name == DISK_IRQ_NAME:
            return int(row.label)
    raise AssertionError(f"no {DISK_IRQ_NAME} in /proc/interrupts")


def counts(row: str) -> dict[int, int]:
    """A row's count per CPU."""
    return read_table(HostPaths())[row].per_cpu


@dataclass(frozen=True)
class DiskIrq:
    irq: int
    cpu: int  # where its interrupts are delivered for the test


@pytest.fixture
def disk_irq_on_cpu() -> Iterator[DiskIrq]:
    """The disk IRQ routed to one CPU for the test, its affinity restored afterwards. A
    managed IRQ (blk-mq queues; the kernel refuses user affinity with EPERM) cannot be
    moved: then its effective CPU is the one the test works on."""
    irq = disk_irq()
    proc = Path(f"/proc/irq/{irq}")
    original = (proc / "smp_affinity_list").read_text().strip()
    try:
        (proc / "smp_affinity_list").write_text(str(CPU))
    except PermissionError:
        effective = parse_cpulist((proc / "effective_affinity_list").read_text())
        yield DiskIrq(irq, effective[0])
        return
    try:
        yield DiskIrq(irq, CPU)
    finally:
        (proc / "smp_affinity_list").write_text(original)


@pytest.fixture
def block_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A file on the root filesystem (the virtio disk), written through and synced, so
    that O_DIRECT reads of it are served by the disk."""
    path = Path("/var/tmp") / f"gpujitter-irq-{os.getpid()}"
    with open(path, "wb") as f:
        f.write(os.urandom(8 << 20))
        f.flush()
        os.fsync(f.fileno())
    try:
        yield path
    finally:
        path.unlink()


class Children:
    """Worker processes started idle (so their pids can be watched from the start) and
    released together by `go()`."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, code: str) -> int:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc.pid

    def spinner(self, seconds: float, cpu: int = CPU, rt: int = 0) -> int:
        return self.start(SPIN.format(cpu=cpu, rt=rt, seconds=seconds))

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def wait(self) -> None:
        for proc in self.procs:
            assert proc.wait(timeout=120) == 0


@contextmanager
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        for proc in kids.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def stolen_by(rec: Recorded, name: str, tgids: set[int]) -> list[IrqStolen]:
    return [e for e in rec.of(IrqStolen, name=name) if e.tgid in tgids]


def cpu_count_of(rec: Recorded, name: str, cpu: int) -> int:
    """How often the per-CPU totals say `name` ran on `cpu` over the whole run."""
    return sum(n for s in rec.of(CpuStats, cpu=cpu) for nm, _ns, n in s.top_irqs if nm == name)


@dataclass
class DiskRun:
    rec: Recorded
    watched: set[int]
    inner: int  # disk IRQs on the CPU while the reads ran
    outer: int  # disk IRQs on the CPU while the probe was attached, and a little more


def direct_reads_under_probe(
    disk: DiskIrq, block_file: Path, n: int, topology: Topology | None = None
) -> DiskRun:
    """A watched process reads n blocks from disk while another watched one keeps the
    disk IRQ's CPU busy: the completion interrupts land while the spinner is current. The
    reader's real-time priority is above the spinner's, so it runs as soon as its read
    completes."""
    row = str(disk.irq)
    with children() as kids:
        reader = kids.start(
            DIRECT_READS.format(cpu=disk.cpu, rt=2, path=str(block_file), block=BLOCK, n=n)
        )
        spinner = kids.spinner(seconds=120, cpu=disk.cpu, rt=1)
        inner: list[int] = []

        def load() -> None:
            before = counts(row)[disk.cpu]
            kids.go()
            assert kids.procs[0].wait(timeout=120) == 0
            inner.append(counts(row)[disk.cpu] - before)
            kids.procs[1].kill()

        outer_before = counts(row)[disk.cpu]
        rec = run_probes(
            ["irq"],
            load,
            watch=WatchSpec(pids={reader, spinner}),
            thresholds=EVERY_WINDOW,
            topology=topology,
        )
        outer = counts(row)[disk.cpu] - outer_before
    return DiskRun(rec, {reader, spinner}, inner[0], outer)


def test_disk_irq_on_a_watched_cpu_is_stolen_time(
    disk_irq_on_cpu: DiskIrq, block_file: Path
) -> None:
    disk, n = disk_irq_on_cpu, 2000
    run = direct_reads_under_probe(disk, block_file, n)
    assert run.inner >= 0.9 * n  # the disk really completed our reads with interrupts here

    stolen = stolen_by(run.rec, DISK_IRQ_NAME, run.watched)
    assert stolen, "no disk IRQ time stolen from the watched processes"
    assert {(e.cpu, e.irq_kind, e.irq) for e in stolen} == {(disk.cpu, "hardirq", disk.irq)}
    count = sum(e.count for e in stolen)
    # Nearly every completion arrived while a watched process was current (the rest while
    # RT throttling let others run); none can be counted that the kernel did not count.
    assert 0.8 * run.inner <= count <= run.outer
    total_ns = sum(e.total_ns for e in stolen)
    assert 300 <= total_ns / count <= 200_000  # a virtio completion handler, per IRQ
    for e in stolen:
        assert e.ts_ns <= e.end_ns
        assert e.total_ns <= e.end_ns - e.ts_ns
        assert not e.remote  # no topology says the disk is elsewhere

    # The per-CPU totals saw every one the kernel counted while attached.
    assert run.inner <= cpu_count_of(run.rec, DISK_IRQ_NAME, disk.cpu) <= run.outer
    assert run.rec.status("irq").lost_kernel == 0


@SHARED
def test_busy_watched_thread_loses_timer_ticks_and_ipis(shared: bool) -> None:
    with children() as kids:
        spinner = kids.spinner(seconds=1.5, rt=1)
        during: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        rows = ("LOC", "CAL", "RES")

        def load() -> None:
            before = tuple(counts(r)[CPU] for r in rows)
            kids.go()
            kids.wait()
            during["rows"] = (before, tuple(counts(r)[CPU] for r in rows))

        outer_before = tuple(counts(r)[CPU] for r in rows)
        rec = run_probes(["irq"], load, watch=WatchSpec(pids={spinner}), thresholds=EVERY_WINDOW,
                         options=vectors(shared))  # fmt: skip
        outer_after = tuple(counts(r)[CPU] for r in rows)
    inner = dict(zip(rows, (b - a for a, b in zip(*during["rows"], strict=True)), strict=True))
    outer = dict(
        zip(rows, (b - a for a, b in zip(outer_before, outer_after, strict=True)), strict=True)
    )

    ticks = stolen_by(rec, "local_timer", {spinner})
    assert {(e.tid, e.cpu, e.irq_kind) for e in ticks} == {(spinner, CPU, "vector")}
    # The tick keeps running on a busy CPU (HZ=250 here): 1.5 s of spinning takes hundreds,
    # nearly all of them while the spinner is current (the rest while RT throttling let
    # others run).
    assert 0.8 * inner["LOC"] <= sum(e.count for e in ticks) <= outer["LOC"]
    assert inner["LOC"] >= 200
    assert all(e.total_ns > 0 for e in ticks)

    # Per-CPU totals against the kernel's per-CPU counters, vector by vector.
    seen = {name: cpu_count_of(rec, name, CPU) for name in ("local_timer", "reschedule")}
    calls = cpu_count_of(rec, "call_function", CPU) + cpu_count_of(rec, "call_function_single", CPU)
    assert inner["LOC"] <= seen["local_timer"] <= outer["LOC"]
    assert inner["RES"] <= seen["reschedule"] <= outer["RES"]
    assert inner["CAL"] <= calls <= outer["CAL"]
    # Softirqs run on the tick's exit (TIMER, RCU, SCHED) are stolen too.
    soft = [e for e in rec.of(IrqStolen, tgid=spinner) if e.irq_kind == "softirq"]
    assert soft and all(e.cpu == CPU for e in soft)


# Bounces a byte `n` times between two processes pinned to two CPUs: the one on {cpu} sleeps
# in a read between the bounces and is woken by the other each time, by an IPI where {cpu} is
# idle (or, where a task holds it, to preempt that task). The other waits 0.5 ms before each
# bounce: longer than an idle CPU polls for work before it halts (cpuidle-haltpoll's 200 µs
# by default), which it may be woken from without an IPI.
BOUNCE = textwrap.dedent("""
    import os, sys, time
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    def pin(cpu):
        os.sched_setaffinity(0, {{cpu}})
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    if os.fork() == 0:
        os.close(w1)
        pin({cpu})
        while os.read(r1, 1):
            os.write(w2, b"x")
        os._exit(0)
    pin({other})
    sys.stdin.readline()
    for _ in range({n}):
        time.sleep(0.0005)
        os.write(w1, b"x")
        os.read(r2, 1)
    os.close(w1)
    assert os.wait()[1] == 0
""")
IPI_ROWS = ("RES", "CAL")  # /proc/interrupts: reschedule, function call (single and many)
IPI_NAMES = ("reschedule", "call_function", "call_function_single")


@dataclass
class Ipis:
    count: int  # what the probe's per-CPU totals counted
    ns: int  # and the time they gave them
    inner: int  # the kernel's count while the bounces ran
    outer: int  # and while the probe was attached


def ipis_while_bouncing(cpu: int, other: int, n: int, *, busy: bool, shared: bool) -> Ipis:
    with children() as kids:
        kids.start(BOUNCE.format(cpu=cpu, other=other, n=n))
        if busy:  # holds the CPU between the bounces; the woken process preempts it
            kids.spinner(seconds=1.0, cpu=cpu)
        during: list[int] = []

        def load() -> None:
            before = sum(counts(r)[cpu] for r in IPI_ROWS)
            kids.go()
            kids.wait()
            during.append(sum(counts(r)[cpu] for r in IPI_ROWS) - before)

        # this process and its probe thread off the CPU: their own turns there would be
        # interrupted by the wake-ups meant for an idle CPU
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {other})
        try:
            outer_before = sum(counts(r)[cpu] for r in IPI_ROWS)
            rec = run_probes(["irq"], load, watch=WatchSpec(), options=vectors(shared))
            outer = sum(counts(r)[cpu] for r in IPI_ROWS) - outer_before
        finally:
            os.sched_setaffinity(0, mine)
    rows = [r for s in rec.of(CpuStats, cpu=cpu) for r in s.top_irqs if r[0] in IPI_NAMES]
    return Ipis(sum(r[2] for r in rows), sum(r[1] for r in rows), during[0], outer)


@SHARED
def test_ipis_that_wake_an_idle_cpu_are_counted_not_timed(shared: bool) -> None:
    """An IPI that wakes a thread onto an idle CPU takes no task's time: the per-CPU totals
    count it and give it none (irq.bpf.c, vector_entered), which spares two clock reads per
    such wake-up. The same wake-ups while a spinner holds the CPU interrupt a task, and are
    timed: the yardstick."""
    others = os.sched_getaffinity(0) - {CPU}
    assert others, "the bounce needs two CPUs"
    cpu, n = min(others), 1000  # not CPU, where the other tests pin their load
    busy = ipis_while_bouncing(cpu, CPU, n, busy=True, shared=shared)
    assert busy.ns > 0
    per_busy_ipi = busy.ns / busy.count
    # An IPI that finds another task on the CPU (this machine is shared) is timed: the
    # quietest of up to three runs is the one that tells. Here an idle run's IPIs average
    # 0-15 ns, against 230-410 ns an IPI that interrupts the spinner; timed, an IPI that woke
    # the idle CPU took ~1.5 µs (its handler ran on cold caches), 5 times the spinner's.
    for _ in range(3):
        idle = ipis_while_bouncing(cpu, CPU, n, busy=False, shared=shared)
        # the waker's 0.5 ms outlasts the idle CPU's polling: each wake-up takes an IPI
        assert idle.inner >= n // 2, f"{idle.inner} IPIs for {n} wake-ups"
        if idle.ns / idle.count < per_busy_ipi / 2:
            break
    assert idle.ns / idle.count < per_busy_ipi / 2
    for run in (busy, idle):
        # a few of ~2,000 have gone uncounted in one run of about ten, before this change as
        # since (cause not found); a wake-up's count is not what this test is about
        assert 0.98 * run.inner <= run.count <= run.outer


def test_a_stop_hands_over_what_was_counted_since_the_last_tick() -> None:
    """Ticks a minute apart: none falls due after the first, and the per-CPU totals of the
    whole run come from the tick that the stop runs (runner.ProbeSet.run). Without it the
    last partial second of every run was lost."""
    run = spin_under_irq(0.5, watched=False, tick_ms=60_000)
    assert run.inner >= 50  # HZ=250 here: a busy CPU's tick keeps running
    assert run.inner <= cpu_count_of(run.rec, "local_timer", CPU) <= run.outer


@dataclass
class Spin:
    rec: Recorded
    spinner: int
    inner: int  # timer ticks on CPU while the spinner ran
    outer: int  # and while the probe was attached


def spin_under_irq(seconds: float, *, watched: bool, **run_kwargs: Any) -> Spin:
    """A real-time spinner on CPU for `seconds` under the irq probe (watching it or nothing;
    `run_kwargs` for run_probes), with the kernel's count of CPU's timer ticks."""
    with children() as kids:
        spinner = kids.spinner(seconds=seconds, rt=1)
        during: list[int] = []

        def load() -> None:
            before = counts("LOC")[CPU]
            kids.go()
            kids.wait()
            during.append(counts("LOC")[CPU] - before)

        outer_before = counts("LOC")[CPU]
        watch = WatchSpec(pids={spinner}) if watched else WatchSpec()
        rec = run_probes(["irq"], load, watch=watch, **run_kwargs)
        outer = counts("LOC")[CPU] - outer_before
    return Spin(rec, spinner, during[0], outer)


def test_a_window_is_queued_once_it_reaches_the_threshold_and_delivered_whole() -> None:
    """With a threshold of a few ticks (~2-10 µs each on these VMs), a busy thread's 100 ms
    windows of timer ticks (~25 at HZ=250) reach it midway: each is queued then, once, and
    delivered with every tick from its first."""
    stolen_ns = 20_000
    run = spin_under_irq(1.5, watched=True, thresholds={"irq": {"stolen": stolen_ns}})
    ticks = stolen_by(run.rec, "local_timer", {run.spinner})
    assert all(e.total_ns >= stolen_ns for e in ticks)
    # Every window but the run's first and last holds ~25 ticks, past the threshold.
    assert 0.8 * run.inner <= sum(e.count for e in ticks) <= run.outer
    assert run.rec.status("irq").lost_kernel == 0  # no key queued twice (it would count lost)


def window_key(table: Any, tid: int) -> Any:
    """The key of a window long closed (index 1) of thread `tid` on CPU 0, local timer."""
    key = table.Key()
    key.window, key.tid, key.cpu = 1, tid, 0
    key.src.kind = irq_probe.VECTOR
    return key


def write_window(table: Any, key: Any, *, queued: bool) -> None:
    table[key] = table.Leaf(first_ns=1, last_ns=2, count=1, total_ns=50_000, queued=queued)


def test_a_queued_window_the_lru_evicted_before_its_sweep_is_counted_lost() -> None:
    """The map evicts its least recently written windows to make room, the queued ones too
    when a map's worth of windows comes between a window and its sweep (made here from user
    space). A queued key that finds no window, finds one made again under it that never
    reached the threshold, or comes twice, is a window lost, counted in lost_kernel; the
    windows found are delivered once."""
    events: list[Event] = []
    gone, kept, twice, remade = 0x7FFF0001, 0x7FFF0002, 0x7FFF0003, 0x7FFF0004
    with children() as kids:
        idle = kids.start("import sys; sys.stdin.readline()")  # watched; never released
        with ProbeSet(
            ["irq"], topology=load_topology(), watch=WatchSpec(pids={idle}), emit=events.append
        ) as probes:
            (started,) = probes.start()
            assert started.state == "running"
            (irq,) = probes.probes
            assert isinstance(irq, IrqProbe)
            table, queue = irq.bpf["stolen"], irq.bpf["opened"]
            first = window_key(table, gone)
            write_window(table, first, queued=True)
            queue.push(first)
            size = table.max_entries
            for batch in range(2):  # twice the map's size of windows, not queued
                keys = (window_key(table, batch * size + n) for n in range(size))
                table.items_update_batch((table.Key * size)(*keys), (table.Leaf * size)())
            assert first not in table  # evicted
            for tid, queued, pushes in ((kept, True, 1), (twice, True, 2), (remade, False, 1)):
                key = window_key(table, tid)
                write_window(table, key, queued=queued)
                for _ in range(pushes):
                    queue.push(key)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and len(delivered(events)) < 2:
                time.sleep(0.05)
                probes.poll()  # sweeps once a window has closed since the start
            probes.tick(time.monotonic_ns())
    assert sorted(delivered(events)) == [kept, twice]
    status = [e for e in events if isinstance(e, ProbeStatus) and e.probe == "irq"][-1]
    assert status.lost_kernel - started.lost_kernel == 3  # gone, twice's second, remade


def delivered(events: list[Event]) -> list[int]:
    return [e.tid for e in events if isinstance(e, IrqStolen) and e.tid >= 0x7FFF0000]


def test_deleting_windows_the_lru_took_meanwhile_deletes_the_rest() -> None:
    """The sweep deletes the windows it delivered in one batch; one that the LRU evicted
    since its lookup ends the kernel's batch there, and the rest are deleted all the same."""
    from bcc import BPF

    bpf = BPF(text='BPF_TABLE("lru_hash", u64, u64, windows, 16);')
    try:
        table = bpf["windows"]
        for n in (1, 3, 5):
            table[ct.c_uint64(n)] = ct.c_uint64(n)
        delete_keys(table, [ct.c_uint64(n) for n in (1, 2, 3, 4, 5)])
        assert len(list(table.keys())) == 0
    finally:
        bpf.cleanup()


def test_remote_flag_follows_the_topology_override(
    disk_irq_on_cpu: DiskIrq, block_file: Path, tmp_path: Path
) -> None:
    """With the disk's device put on a node that the handling CPU is not on, its IRQs are
    remote; the vectors (no device) never are."""
    disk = disk_irq_on_cpu
    others = [c for c in sorted(os.sched_getaffinity(0)) if c != disk.cpu]
    override = tmp_path / "topology.toml"
    override.write_text(
        f'[nodes]\n0 = "{disk.cpu}"\n1 = "{format_cpulist(others)}"\n[irqs]\n{disk.irq} = 1\n'
    )
    run = direct_reads_under_probe(disk, block_file, 300, topology=load_topology(override=override))
    stolen = stolen_by(run.rec, DISK_IRQ_NAME, run.watched)
    assert stolen and all(e.remote for e in stolen)
    assert not any(e.remote for e in run.rec.of(IrqStolen) if e.irq_kind != "hardirq")
    remote_totals = [r for s in run.rec.of(CpuStats, cpu=disk.cpu) for r in s.remote_irqs]
    assert {name for name, _ns, _n in remote_totals} == {DISK_IRQ_NAME}


def test_unwatched_threads_lose_nothing_that_is_reported() -> None:
    with children() as kids:
        watched = kids.spinner(seconds=1.0)
        unwatched = kids.spinner(seconds=1.0)

        def load() -> None:
            kids.go()
            kids.wait()

        rec = run_probes(["irq"], load, watch=WatchSpec(pids={watched}), thresholds=EVERY_WINDOW)
    stolen = rec.of(IrqStolen)
    assert {e.tgid for e in stolen} == {watched}
    assert unwatched not in {e.tid for e in stolen}
    # The unwatched spinner shared the CPU, so its ticks still show in the per-CPU totals.
    ticks_on_cpu = cpu_count_of(rec, "local_timer", CPU)
    ticks_stolen = sum(e.count for e in stolen if e.name == "local_timer")
    assert ticks_on_cpu > ticks_stolen > 0


@SHARED
def test_missing_vector_hooks_degrade_the_probe_and_the_rest_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    """A kernel without most irq_vectors tracepoints (forced: the probe looks them up in a
    tracefs that has only the local timer's) gets a degraded probe that says what it
    cannot see and still reports the rest."""
    fake = tmp_path / "events/irq_vectors"
    for edge in ("entry", "exit"):
        (fake / f"local_timer_{edge}").mkdir(parents=True)
    monkeypatch.setattr(irq_probe, "TRACEFS", tmp_path)
    with children() as kids:
        spinner = kids.spinner(seconds=1.0, rt=1)

        def load() -> None:
            kids.go()
            kids.wait()

        rec = run_probes(["irq"], load, watch=WatchSpec(pids={spinner}), thresholds=EVERY_WINDOW,
                         options=vectors(shared))  # fmt: skip
    status = rec.status("irq")
    assert status.state == "degraded"
    assert "reschedule" in status.reason and "local_timer" not in status.reason
    names = {e.name for e in rec.of(IrqStolen) if e.irq_kind == "vector"}
    assert names == {"local_timer"}
    seen = {n for s in rec.of(CpuStats) for n, _ns, _c in s.top_irqs}
    assert not seen & {"reschedule", "call_function", "call_function_single", "irq_work"}
