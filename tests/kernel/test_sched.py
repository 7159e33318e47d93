"""sched probe on the real kernel: run-queue waits behind a CPU hog (checked against the
kernel's own schedstat), off-CPU states with the syscall and the waker, a forced cross-node
migration under a topology override, thresholds applied in the kernel, an interval still open
at a read announced once, unwatched processes ignored, a probe that the kernel refuses
reported unavailable while the others run, and the thread filter's bits (sched's and
cstate's) gone with the threads that set them."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.drill import system
from gpujitter.probes import registry
from gpujitter.probes import sched as sched_probe
from gpujitter.probes.btf import BtfError
from gpujitter.probes.events import (
    IdleWake,
    Log2Hist,
    Migration,
    NodeTime,
    OffCpu,
    OffCpuOpen,
    ThreadSched,
    WorkloadInfo,
)
from gpujitter.probes.mapbatch import MapBatch
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.sched import SchedProbe
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from tests.kernel.conftest import Recorded, run_probes
from tests.kernel.sched_load import (
    Child,
    held_within,
    hog,
    idle_log,
    quietest_cpu,
    switch_log,
    together,
    unseen_off_cpu,
    untraced_switch_ins,
    unwatched,
)

MS = 1_000_000
# x86_64 system call numbers
SYS_READ, SYS_WRITE, SYS_PWRITE64, SYS_FSYNC, SYS_FDATASYNC = 0, 1, 18, 74, 75
SYS_CLOCK_NANOSLEEP = 230

EVERYTHING = {"sched": {"offcpu": 0, "runq": 0}}
TOPOLOGY_2NODE = Path(__file__).parents[1] / "fixtures" / "topology-2node.toml"


def blocked_ns(e: OffCpu) -> int:
    """How long the thread slept before it was woken (its run-queue wait follows)."""
    return e.runnable_ns - e.ts_ns


def in_window(events: list[Any], result: dict[str, Any]) -> list[Any]:
    return [e for e in events if e.ts_ns >= result["t0"] and e.end_ns <= result["t1"]]


def test_run_queue_wait_behind_a_hog_is_the_hogs_time_and_names_it() -> None:
    # Child and hog are real-time on CPU 1, the hog above the child: every time the hog
    # wakes (5 ms busy, 5 ms asleep) it preempts the child, which waits on the run queue
    # for exactly the hog's stint; other tasks (real-time beats them) barely get in.
    with (
        hog(1, "gj-hog", fifo_priority=10, busy_s=0.005) as spinner,
        Child(f"""
        pin(1)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        def hog_oncpu():
            with open("/proc/{spinner.pid}/schedstat") as f:
                return int(f.read().split()[0])
        before, hog0 = schedstat(), hog_oncpu()
        out["t0"] = time.monotonic_ns()
        spin(1.5)
        out["t1"] = time.monotonic_ns()
        out["run_delay_ns"] = schedstat()[1] - before[1]
        out["hog_oncpu_ns"] = hog_oncpu() - hog0
    """) as child,
    ):
        rec = run_probes(
            ["sched"],
            child.load,
            watch=WatchSpec(pids={child.pid}),
            thresholds=EVERYTHING,
            settle_s=1.2,  # one more once-a-second sample after the child exited
        )
    res = child.result
    waits = in_window(rec.of(OffCpu, tid=child.pid), res)
    runq = sum(e.runq_ns for e in waits)

    # The kernel's own run-queue accounting of the same thread over the same stretch.
    assert runq == pytest.approx(res["run_delay_ns"], rel=0.05)
    behind_hog = [e for e in waits if e.other_comm == "gj-hog"]
    assert sum(e.runq_ns for e in behind_hog) == pytest.approx(res["hog_oncpu_ns"], rel=0.1)
    assert sum(e.runq_ns for e in behind_hog) > 0.85 * runq
    assert 100 < len(behind_hog) < 160  # one per 5 ms stint of 1.5 s, sleeps oversleep
    assert all(e.other_tid == spinner.pid and e.state == "preempted" for e in behind_hog)
    assert all(e.runnable_ns == e.ts_ns and e.cpu == e.cpu_in == 1 for e in behind_hog)
    assert all(e.tgid == child.pid and e.comm == res["comm"] for e in waits)

    # In-kernel counters and histograms saw every interval that was streamed (threshold 0).
    everything = rec.of(OffCpu, tid=child.pid)
    totals = rec.of(ThreadSched, tid=child.pid)
    assert sum(t.runq_ns for t in totals) == sum(e.runq_ns for e in everything)
    assert sum(t.offcpu_ns for t in totals) == sum(e.end_ns - e.ts_ns for e in everything)
    assert sum(t.preemptions for t in totals) >= len(behind_hog)
    runq_hist = rec.of(Log2Hist, probe="sched", name="runq")
    assert sum(n for h in runq_hist for _, n in h.buckets) == len(everything)
    assert rec.status("sched").lost_kernel == 0


def test_the_task_named_is_the_one_that_held_the_cpu_not_the_last_to_leave_it() -> None:
    # Real-time on CPU 1, from the highest: a hog (5 ms busy, then wakes a short task and
    # sleeps 5 ms), the short task (0.2 ms busy each time it is woken), the watched child.
    # Each of the hog's stints preempts the child; the short task runs after the hog, so it
    # is the task switched out right before the child resumes, for 1/25 of the wait.
    # Real-time tasks get 950 ms a second (sched_rt_runtime_us): for the rest all three wait
    # while other tasks run or the CPU idles. A hog stint the throttle interrupts ends as soon
    # as the hog runs again (its 5 ms have passed by then): interrupted within its first
    # 0.2 ms, the hog held less of that wait than the short task after it (CI, 2026-12-02:
    # a 12.9 ms wait, the short task's 254 us the most any task held), and naming the short
    # task is right. So a raw log of the CPU's switches says, wait by wait, who held it.
    read_end, write_end = os.pipe()
    short = unwatched(1, "gj-short", f"""
    while os.read({read_end}, 1):
        end = time.monotonic() + 0.0002
        while time.monotonic() < end:
            pass
    """, fifo_priority=7, pass_fds=(read_end,))  # fmt: skip
    hogging = unwatched(1, "gj-hog", f"""
    while True:
        end = time.monotonic() + 0.005
        while time.monotonic() < end:
            pass
        os.write({write_end}, b"x")
        time.sleep(0.005)
    """, fifo_priority=10, pass_fds=(write_end,))  # fmt: skip
    with short as shorter, hogging as hogger, idle_log(1) as logged:
        os.close(read_end)
        os.close(write_end)
        with Child(f"""
        pin(1)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        def oncpu(pid):
            with open(f"/proc/{{pid}}/schedstat") as f:
                return int(f.read().split()[0])
        hog0 = oncpu({hogger.pid})
        out["t0"] = time.monotonic_ns()
        spin(1.5)
        out["t1"] = time.monotonic_ns()
        out["hog_oncpu_ns"] = oncpu({hogger.pid}) - hog0
        """) as child:
            rec = run_probes(
                ["sched"], child.load, watch=WatchSpec(pids={child.pid}), thresholds=EVERYTHING
            )
        log = logged()
    waits = in_window(rec.of(OffCpu, tid=child.pid), child.result)
    runq = sum(e.runq_ns for e in waits)
    behind_hog = [e for e in waits if e.other_comm == "gj-hog"]
    assert sum(e.runq_ns for e in behind_hog) > 0.85 * runq, {e.other_comm for e in waits}
    assert all(e.other_tid == hogger.pid for e in behind_hog)
    # Named by its last place, the short task would be named in nearly every wait, where the
    # log has the hog hold 5 ms to its 0.2.
    misnamed = [
        (e, held_within(log, hogger.pid, e.runnable_ns, e.end_ns))
        for e in waits
        if e.other_comm == "gj-short"
        and held_within(log, hogger.pid, e.runnable_ns, e.end_ns)
        >= held_within(log, shorter.pid, e.runnable_ns, e.end_ns)
    ]
    assert not misnamed
    # The time it held the CPU: its stints, as the kernel counted them, less the short
    # task's 0.2 ms after each, which the child waited through too.
    held = sum(e.other_ns for e in behind_hog)
    assert held == pytest.approx(child.result["hog_oncpu_ns"], rel=0.1)
    assert all(0 < e.other_ns <= e.runq_ns for e in behind_hog)
    # What the hog did not hold of those waits: the short task's 0.2 ms per 5.2 ms (3.8 %),
    # plus the switches and the VM's own jitter: 8-10.4 % in 6 runs here (2026-12-01, the
    # same before and after sched's filter bits), so 15 %: a hog's stint missed from its
    # held time (5 ms of 5.2) still fails it.
    assert sum(e.runq_ns - e.other_ns for e in behind_hog) < 0.15 * runq


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "perf-tracepoints"])
def test_off_cpu_states_carry_the_syscall_and_the_waker(
    tmp_path: Path, raw: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not raw:  # a kernel whose BTF lacks the fields: the perf tracepoints' programs

        def no_offsets(*args: Any) -> list[str]:
            raise BtfError("refused by the test")

        monkeypatch.setattr(sched_probe, "offset_cflags", no_offsets)
    with (
        Child(f"""
        for _ in range(5):
            time.sleep(0.02)                   # clock_nanosleep: sleeping
        r, w = os.pipe()
        def writer():
            out["writer_tid"] = threading.get_native_id()
            time.sleep(0.03)
            os.write(w, b"x")
        t = threading.Thread(target=writer)
        t.start()
        os.read(r, 1)                          # read: sleeping, woken by the writer thread
        t.join()
        import mmap
        buf = mmap.mmap(-1, 1 << 20)
        buf.write(b"y" * (1 << 20))
        fd = os.open({str(tmp_path / "direct")!r}, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
        for _ in range(8):
            os.write(fd, buf)                  # O_DIRECT: waits for the disk, uninterruptible
        os.fsync(fd)
        os.close(fd)
    """) as child,
        contextlib.ExitStack() as logs,
    ):
        logged = [logs.enter_context(idle_log(cpu)) for cpu in range(os.cpu_count() or 1)]
        rec = run_probes(
            ["sched"], child.load, watch=WatchSpec(pids={child.pid}), thresholds=EVERYTHING
        )
        # A wait whose end the kernel did not trace is not streamed (docs/probes.md).
        untraced = sum(untraced_switch_ins(log(), child.pid) for log in logged)
    mine = rec.of(OffCpu, tgid=child.pid)

    main = [e for e in mine if e.tid == child.pid]
    # 20 ms sleeps; a preemption on the way into one can shave a little off its interval
    sleeps = [e for e in main if e.syscall == SYS_CLOCK_NANOSLEEP and blocked_ns(e) >= 15 * MS]
    assert 5 - untraced <= len(sleeps) <= 5, untraced
    assert all(e.state == "sleeping" and blocked_ns(e) < 30 * MS for e in sleeps)

    reads = [e for e in mine if e.syscall == SYS_READ and e.waker_tid == child.result["writer_tid"]]
    assert len(reads) == 1 or (not reads and untraced), untraced
    for read in reads:
        assert read.state == "sleeping"
        assert 25 * MS <= blocked_ns(read) < 60 * MS  # the writer slept 30 ms
        assert read.tid == child.pid

    # The disk's waits, by the call they block in. Not every uninterruptible wait is one: under
    # load an madvise (the allocator giving memory back) waited too (CI under a hog, 2026-12-04).
    stuck = [e for e in mine if e.state == "uninterruptible"]
    disk = [e for e in stuck if e.syscall in (SYS_WRITE, SYS_PWRITE64, SYS_FSYNC, SYS_FDATASYNC)]
    assert disk, f"O_DIRECT writes and fsync must block uninterruptibly: {stuck}"
    assert sum(blocked_ns(e) for e in disk) > 0
    # without BTF's offsets: degraded, and it says why (the twice dearer hooks)
    assert rec.status("sched").state == ("running" if raw else "degraded")
    assert ("perf tracepoints" in rec.status("sched").reason) != raw


SLEEPS = """
    for _ in range(10):
        time.sleep(0.02)
"""


def sleeps_under(
    thresholds: dict[str, int], settle_s: float = 0.3, body: str = SLEEPS
) -> tuple[Child, Recorded, int]:
    """The sleeps of `body` (the ten) under the thresholds; with how many of the child's
    switches back in the kernel did not trace (a sleep whose end the probe cannot see,
    docs/probes.md)."""
    with Child(body) as child, contextlib.ExitStack() as logs:
        logged = [logs.enter_context(idle_log(cpu)) for cpu in range(os.cpu_count() or 1)]
        rec = run_probes(
            ["sched"],
            child.load,
            watch=WatchSpec(pids={child.pid}),
            thresholds={"sched": thresholds},
            settle_s=settle_s,
        )
        untraced = sum(untraced_switch_ins(log(), child.pid) for log in logged)
    return child, rec, untraced


def test_thresholds_filter_in_the_kernel_and_aggregates_still_count() -> None:
    child, rec, untraced = sleeps_under({"offcpu": 15 * MS, "runq": 10_000 * MS})
    streamed = rec.of(OffCpu, tgid=child.pid)
    # Exactly the ten sleeps (the wait for "go" began before the probe watched the child),
    # less those whose end the kernel did not trace.
    assert 10 - untraced <= len(streamed) <= 10
    assert all(15 * MS <= e.end_ns - e.ts_ns < 30 * MS for e in streamed)

    child, rec, untraced = sleeps_under({"offcpu": 50 * MS, "runq": 10_000 * MS}, settle_s=1.2)
    assert rec.of(OffCpu, tgid=child.pid) == []
    # ...while the histogram saw the ten 20 ms sleeps: [16.8 ms, 33.6 ms) is bucket 2^24.
    sleeping = rec.of(Log2Hist, probe="sched", name="offcpu.sleeping")
    assert sum(n for h in sleeping for lo, n in h.buckets if lo == 1 << 24) >= 10 - untraced
    assert sum(t.switches for t in rec.of(ThreadSched, tid=child.pid)) >= 11  # and the exit


LONG_SLEEP = """
    for _ in range(5):
        time.sleep(0.02)
    time.sleep(2.5)
    time.sleep(0.02)
"""


def test_an_interval_open_across_reads_is_announced_once_and_its_record_follows() -> None:
    """The 2.5 s sleep outlasts two of the once-a-second reads: announced at the first,
    with the stamp its OffCpu then carries, as that record's state and syscall; not
    again at the second. The 20 ms sleeps, under the threshold, are not announced."""
    child, rec, untraced = sleeps_under({"offcpu": 100 * MS, "runq": 10_000 * MS}, body=LONG_SLEEP)
    (opened,) = rec.of(OffCpuOpen, tgid=child.pid)
    closed = {e.ts_ns: e for e in rec.of(OffCpu, tgid=child.pid)}
    if opened.ts_ns not in closed:  # its end was one of the switch-ins the kernel missed
        assert untraced, (opened, closed)
        return
    record = closed[opened.ts_ns]
    assert record.end_ns - record.ts_ns >= 2_400 * MS
    assert opened.ts_ns + 100 * MS <= opened.as_of_ns < record.end_ns
    assert (opened.tid, opened.state, opened.syscall) == (record.tid, record.state, record.syscall)
    assert opened.state == "sleeping"


def test_unwatched_processes_produce_nothing() -> None:
    with Child(SLEEPS) as watched, Child(SLEEPS) as unwatched:
        rec = run_probes(
            ["sched"],
            together(watched, unwatched),
            watch=WatchSpec(pids={watched.pid}),
            thresholds=EVERYTHING,
        )
    assert len(rec.of(OffCpu, tgid=watched.pid)) >= 10
    for kind in (OffCpu, ThreadSched, NodeTime, Migration):
        assert rec.of(kind, tgid=unwatched.pid) == []


def test_forced_cross_node_migration_and_node_time_split() -> None:
    # Under the override CPU 0 is node 0 and CPU 1 node 1: moving the thread by affinity
    # crosses nodes twice, and its on-CPU time splits by the time spun on each.
    # The sleep: on-CPU time counts from the first switch-out the probe saw (docs/probes.md),
    # and a spinning child on an idle CPU may not switch for 350 ms.
    with (
        Child("""
        pin(0)
        time.sleep(0.01)
        spin(0.05)
        out["t_move"] = time.monotonic_ns()
        c0 = time.thread_time_ns()
        spin(0.3)
        c1 = time.thread_time_ns()
        pin(1)
        spin(0.2)
        c2 = time.thread_time_ns()
        pin(0)
        spin(0.1)
        c3 = time.thread_time_ns()
        out["node0_ns"] = c1 - c0 + c3 - c2
        out["node1_ns"] = c2 - c1
    """) as child,
        idle_log(0) as cpu0,
        idle_log(1) as cpu1,
    ):
        rec = run_probes(
            ["sched"],
            child.load,
            watch=WatchSpec(pids={child.pid}),
            topology=load_topology(override=TOPOLOGY_2NODE),
            settle_s=1.2,
        )
        switches = sorted(
            (e.ts_ns, cpu, e.prev_pid, e.next_pid)
            for cpu, log in ((0, cpu0), (1, cpu1))
            for e in log()
            if e.kind == "switch" and child.pid in (e.prev_pid, e.next_pid)
        )
    res = child.result
    moves = [m for m in rec.of(Migration, tid=child.pid) if m.ts_ns > res["t_move"]]
    assert [(m.src_cpu, m.dst_cpu, m.src_node, m.dst_node) for m in moves] == [
        (0, 1, 0, 1),
        (1, 0, 1, 0),
    ]
    assert all(m.cross_node and m.tgid == child.pid and m.comm == res["comm"] for m in moves)
    totals = rec.of(ThreadSched, tid=child.pid)
    assert sum(t.cross_node_migrations for t in totals) == len(rec.of(Migration, tid=child.pid))

    node_ns = {0: 0, 1: 0}
    for nt in rec.of(NodeTime, tid=child.pid):
        for node, ns in nt.node_ns:
            node_ns[node] += ns
    # node 0 also holds the child's start (the pin and 50 ms spin before t_move). In CI a
    # switch-in of the child that the kernel did not trace (after a thread of this VM's
    # PID-1 agent) lost a whole stint while stints were timed from switch-in to switch-out
    # (144 and 214 ms of 400); the message keeps what the probe saw and every switch of the
    # child, from a second program, as the kernel traced them.
    story = (
        f"{node_ns} {res}\n"
        + rec.story(res["t_move"], tid=child.pid)
        + "".join(
            f"\n  switch on CPU {cpu} at {(ts - res['t_move']) / 1e6:.3f}: {a} -> {b}"
            for ts, cpu, a, b in switches
        )
    )
    assert res["node0_ns"] <= node_ns[0] < res["node0_ns"] + 80 * MS, story
    assert node_ns[1] == pytest.approx(res["node1_ns"], rel=0.05, abs=2 * MS), story


def test_a_busy_threads_samples_hold_at_most_their_interval_and_add_up_to_its_cpu_time() -> None:
    # The runner hands every probe the tick's time, read before the core's refresh and the
    # other probes' samples: sched reads its maps later, here 100 ms later, then at once
    # again. A thread on CPU nearly throughout (short sleeps every 20 ms: many switch-outs,
    # some while the maps are read) must show at most each sample's interval (the probe's own
    # reads), and its samples must add up to its CPU time (its schedstat) from its first
    # switch-out to its exit.
    cpu = quietest_cpu()
    with Child(f"""
        def work():
            pin({cpu})
            out["tid"] = threading.get_native_id()
            out["ran_ns"] = -schedstat()[0]
            time.sleep(0.001)  # its first switch-out: on-CPU time counts from here
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                spin(0.02)
                time.sleep(0.0001)
            out["ran_ns"] += schedstat()[0]
        process_ns = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()  # its exit is in the process's CPU time, the main thread's few µs too
        out["process_ns"] = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID) - process_ns
    """) as child:
        samples: list[Any] = []
        late: list[tuple[int, int]] = []  # (tick, read) of each late read
        with ProbeSet(
            ["sched"],
            topology=load_topology(),
            watch=WatchSpec(pids={child.pid}),
            emit=list().append,
        ) as probes:
            assert [s.state for s in probes.start()] == ["running"]
            (sched,) = probes.probes
            child.go()
            while child.proc.poll() is None:
                time.sleep(0.2)
                tick_ns = time.monotonic_ns()
                time.sleep(0.1)
                late.append((tick_ns, time.monotonic_ns()))
                for now_ns in (tick_ns, time.monotonic_ns()):
                    samples += sched.sample(now_ns)
            for _ in range(3):  # what a sample held back comes out in the next ones
                time.sleep(0.2)
                samples += sched.sample(time.monotonic_ns())
        res = child.wait()
    mine = [e for e in samples if isinstance(e, ThreadSched) and e.tid == res["tid"]]
    story = f"{res} {late}\n" + "\n".join(
        f"  {(e.ts_ns - late[0][0]) / MS:9.3f} +{e.interval_ns / MS:8.3f}: {e.oncpu_ns / MS:.3f}"
        for e in mine
    )
    assert all(e.oncpu_ns <= e.interval_ns for e in mine), story
    # Its CPU time from its first switch-out to its exit: its own schedstat reads leave out
    # the few microseconds from the first read to that sleep (the probe counts from there:
    # none may be missing beyond that) and the thread's exit after the last read, which the
    # probe counts: 0.5-0.8 ms here, 8.5 ms on a busy CI machine whose page faults were slow.
    # The process's CPU time over the thread's life holds all of it, less the interrupt and
    # steal time inside the stints the probe times by the clock (0.4-1.9 ms here, 2 of 15).
    counted_ns = sum(e.oncpu_ns for e in mine)
    assert res["ran_ns"] - 0.2 * MS <= counted_ns <= res["process_ns"] + 5 * MS, story
    nodes = [e for e in samples if isinstance(e, NodeTime) and e.tid == res["tid"]]
    assert sum(ns for e in nodes for _, ns in e.node_ns) == sum(e.oncpu_ns for e in mine)


class BadHookProbe(SchedProbe):
    def attach(self, ctx: Any) -> None:
        self.bpf.attach_tracepoint(
            tp="sched:gj_no_such_event", fn_name=b"tracepoint__sched__sched_migrate_task"
        )


class NoRegsProbe(SchedProbe):
    """A kernel without BTF-typed task helpers: the first compile (with pt_regs) fails."""

    def cflags(self, ctx: Any) -> list[str]:
        flags = super().cflags(ctx)
        if self.syscall_from_regs:
            # an untyped task pointer: what the verifier refuses where BTF helpers are missing
            flags.append("-Dbpf_get_current_task_btf()=bpf_get_current_task()")
        return flags


def test_a_refused_probe_is_unavailable_and_the_others_run(monkeypatch: Any) -> None:
    sched = registry.get("sched")
    broken = replace(sched, name="broken", factory=BadHookProbe)
    no_regs = replace(sched, name="sched-noregs", factory=NoRegsProbe)
    monkeypatch.setitem(registry._SPECS, "broken", broken)
    monkeypatch.setitem(registry._SPECS, "sched-noregs", no_regs)
    # Pinned where it leaves the CPU idle: left to the scheduler beside a hog it may stay on
    # the hog's CPU and never wake onto an idle one (2 runs in 12 here, no IdleWake at all).
    body = f"\n    pin({quietest_cpu()})\n" + SLEEPS + "\n    time.sleep(0.02)\n"
    with Child(body) as child, contextlib.ExitStack() as logs:
        logged = [logs.enter_context(idle_log(cpu)) for cpu in range(os.cpu_count() or 1)]
        rec = run_probes(
            ["broken", "sched-noregs", "cstate"],
            child.load,
            watch=WatchSpec(pids={child.pid}),
            thresholds={
                "broken": EVERYTHING["sched"],
                "sched-noregs": EVERYTHING["sched"],
                "cstate": {"wake": 0},
            },
        )
        cpu_logs = [log() for log in logged]
    assert rec.status("broken").state == "unavailable"
    assert "gj_no_such_event" in rec.status("broken").reason
    degraded = rec.status("sched-noregs")
    assert degraded.state == "degraded"
    assert "syscall" in degraded.reason
    # The eleven 20 ms sleeps (each >= 20 ms blocked in 28 runs under one or two hogs), less
    # those whose end the kernel did not trace: a switch back to the child from one of the VM
    # agent's threads never reaches a tracepoint (docs/probes.md), and the sleep it ends is
    # not streamed. Under load the child shares its CPU with those threads more often: CI
    # under a hog, 2026-12-05, 10 of 11; here 2 runs in 28, each with one untraced switch-in.
    untraced = sum(untraced_switch_ins(log, child.pid) for log in cpu_logs)
    switches = [e for log in cpu_logs for e in log if e.kind == "switch"]
    first_out = min((e.ts_ns for e in switches if e.prev_pid == child.pid), default=0)
    assert first_out, "the per-CPU logs saw none of the child's switches: nothing to check"
    sleeps = [e for e in rec.of(OffCpu, tgid=child.pid) if blocked_ns(e) >= 15 * MS]
    story = f"untraced {untraced}\n" + rec.story(first_out, tgid=child.pid)
    assert sleeps, story
    assert 11 - untraced <= len(sleeps) <= 11, story
    assert {e.syscall for e in sleeps} == {-1}
    # cstate ran beside them and reported every wake-up of the child onto an idle CPU that
    # the logs show (the idle task, switched in, entered an idle state before the child came)
    # after its first switch-out (its wait for "go" began before it was watched); where no
    # CPU idled (a hog on each) there are none, and none to report.
    from_idle = 0
    for log in cpu_logs:
        idled = False
        for e in log:
            if e.kind == "entry":
                idled = True
            elif e.kind == "switch":
                woke = e.prev_pid == 0 and e.next_pid == child.pid and e.ts_ns > first_out
                from_idle += idled and woke
                idled = False
    assert rec.status("cstate").state == "running"
    assert len(rec.of(IdleWake, tgid=child.pid)) >= from_idle, story


def test_waits_on_block_reads_carry_the_disk(tmp_path: Path) -> None:
    # A sequential read of a file whose page cache was dropped: the thread sleeps
    # uninterruptibly on read-ahead windows, and each completion wakes it. Its sleeps are
    # the control: the same thread's waits that no block request ended.
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:  # on the disk, not tmpfs
        data = Path(scratch) / "data"
        with data.open("wb") as f:
            f.write(os.urandom(1 << 20) * 96)
        with (
            Child(f"""
            for _ in range(3):
                time.sleep(0.02)
            fd = os.open({str(data)!r}, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            # schedstat's run-queue wait is whole: it only grows when the thread is switched in
            delay0 = schedstat()[1]
            out["t0"] = time.monotonic_ns()
            while os.read(fd, 1 << 20):
                pass
            out["t1"] = time.monotonic_ns()
            out["delay_ns"] = schedstat()[1] - delay0
        """) as child,
            switch_log(child.pid) as logged,
        ):
            rec = run_probes(
                ["sched"], child.load, watch=WatchSpec(pids={child.pid}), thresholds=EVERYTHING
            )
            log = logged()
        disk = system.whole_disk(data)
    res = child.result
    # The truth: the read's time less its stints on a CPU (from the log) and its run-queue
    # wait. Not the thread's CPU clock, which leaves out what the hypervisor steals while
    # the thread runs (this VM's steal count grows while the host is busy): neither run nor
    # wait, that time read as blocked. CI under a hog, 2026-12-04: 59.7 ms blocked by the
    # clock, more than the 53.9 ms the thread spent off CPU in all the probe saw, with no
    # untraced switch: a short CPU clock, as steal makes it.
    elapsed = res["t1"] - res["t0"]
    held = held_within(log, child.pid, res["t0"], res["t1"])
    res["blocked_ns"] = elapsed - held - res["delay_ns"]
    mine = rec.of(OffCpu, tid=child.pid)
    io = [e for e in in_window(mine, res) if e.io_dev]
    assert io, "a read after dropping the page cache must wait on the disk"
    assert {(e.io_dev, e.io_op, e.state, e.syscall) for e in io} == {
        (disk, "read", "uninterruptible", SYS_READ)
    }
    assert all(e.io_bytes > 0 for e in io)
    # The kernel's own accounting: nearly all of the thread's blocked time was these waits,
    # but for those the probe cannot stream: a wait that ends in a switch the kernel does
    # not trace (from the VM agent's threads, docs/probes.md), which is missing whole. The
    # log bounds each by the thread's switch-outs around it (CI, 2026-12-02: 9.7 ms short;
    # here once in 6 runs, 2 such waits, 3.9 ms of the thread's 26 ms blocked).
    unseen = unseen_off_cpu(log, child.pid)
    unseen_ns = sum(b - a for a, b in unseen if res["t0"] <= a and b <= res["t1"])
    io_ns = sum(blocked_ns(e) for e in io)
    assert 0.9 * res["blocked_ns"] - unseen_ns <= io_ns <= 1.1 * res["blocked_ns"], (
        f"{io_ns=} {res['blocked_ns']=} {unseen_ns=} {elapsed=} {held=} {res['delay_ns']=}\n"
        f"{rec.story(res['t0'], tid=child.pid)}"
    )
    # the three sleeps (a preemption inside the call, under load, is no sleep of its own),
    # but for one that ended in a switch the kernel does not trace (CI under a hog,
    # 2026-12-05: 2 of 3): the log bounds those before the read as above
    sleeps = [e for e in mine if e.syscall == SYS_CLOCK_NANOSLEEP and e.state == "sleeping"]
    unseen_before = [(a, b) for a, b in unseen if b <= res["t0"]]
    assert 3 - len(unseen_before) <= len(sleeps) <= 3, (sleeps, unseen_before)
    assert all(e.io_dev == "" and e.io_bytes == 0 and e.io_op == "" for e in sleeps)
    assert rec.status("sched").state == "running"


CONTAINER_ID = "c0ffee" * 10 + "beef"  # 64 hex digits: a Docker scope's name


@pytest.fixture
def docker_scope() -> Any:
    """A cgroup laid out as Docker's systemd driver makes one (cgroup v2), for a process to
    be moved into: the workload reader names it docker <id> (no runtime files here)."""
    root = Path("/sys/fs/cgroup/unified")
    if not (root / "cgroup.procs").exists():
        root = Path("/sys/fs/cgroup")
    scope = root / "system.slice" / f"docker-{CONTAINER_ID}.scope"
    scope.mkdir(parents=True, exist_ok=True)
    yield scope
    for pid in (scope / "cgroup.procs").read_text().split():
        (root / "cgroup.procs").write_text(pid)
    scope.rmdir()


def test_the_task_that_ran_instead_is_named_with_its_process_and_container(
    docker_scope: Path,
) -> None:
    """The hog runs in a container: the run-queue waits name its process, and its workload
    is announced once, before the first record that names it."""
    with (
        hog(1, "gj-hog", fifo_priority=10, busy_s=0.005) as spinner,
        Child("""
        pin(1)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        spin(0.5)
    """) as child,
    ):
        (docker_scope / "cgroup.procs").write_text(str(spinner.pid))
        rec = run_probes(
            ["sched"], child.load, watch=WatchSpec(pids={child.pid}), thresholds=EVERYTHING
        )
    behind = [e for e in rec.of(OffCpu, tid=child.pid) if e.other_comm == "gj-hog"]
    assert behind and all(e.other_tgid == spinner.pid for e in behind)
    infos = rec.of(WorkloadInfo, tgid=spinner.pid)
    assert [(i.workload.kind, i.workload.container_id) for i in infos] == [
        ("container", CONTAINER_ID)
    ]
    assert rec.events.index(infos[0]) < rec.events.index(behind[0])


def set_filter_bits(bpf: Any) -> int:
    """Bits set in a probe's thread filter (gj_task_bits), read whole."""
    batch = MapBatch(bpf["gj_task_bits"])
    return sum(int(batch.values[i]).bit_count() for i in range(batch.read()))


# Alone, sched and cstate each keep a filter; beside sched (one module), cstate's share keeps
# no sleepers and sets no bits: sched's filter is the one to watch.
@pytest.mark.parametrize("names", [["sched"], ["cstate"], ["sched", "cstate"]])
def test_a_watched_threads_filter_bit_goes_with_it_at_its_exit(names: list[str]) -> None:
    # Task structures are reused in place: a bit left set would let the next task in an
    # exited watched thread's place pass the filter at every event of its own.
    with (
        Child("""
        stop = threading.Event()
        def work():
            while not stop.is_set():
                time.sleep(0.005)
        workers = [threading.Thread(target=work) for _ in range(8)]
        for w in workers:
            w.start()
        sys.stdin.readline()
        stop.set()
        for w in workers:
            w.join()
    """) as child,
        ProbeSet(
            names, topology=load_topology(), watch=WatchSpec(pids={child.pid}), emit=[].append
        ) as probes,
    ):
        assert all(s.state == "running" for s in probes.start())
        bpf = probes.probes[0].bpf
        child.go()
        time.sleep(0.3)  # each worker has slept and woken ~50 times
        live = set_filter_bits(bpf)
        assert child.proc.stdin is not None
        child.proc.stdin.write("stop\n")
        child.proc.stdin.flush()
        child.wait()
        time.sleep(0.1)
        # eight workers and the main thread (asleep in its second read), any two of
        # which may share a bit of the 2^22
        assert live >= 8
        assert set_filter_bits(bpf) == 0
