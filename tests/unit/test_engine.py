"""Attribution engine: each cause alone with exact expected time, overlaps and precedence,
remote flags under two NUMA nodes, remedies. Gap [100, 140] ms (40 ms) throughout unless
said; thread 101 of process 100 feeds GPU 0 (node 0: CPUs 0-1)."""

from __future__ import annotations

from dataclasses import replace

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.analysis.describe import one_line
from gpujitter.daemon.analysis.engine import Engine
from gpujitter.daemon.analysis.engine.divide import MAX_HOPS
from gpujitter.daemon.analysis.gaps import UNKNOWN_GPU
from gpujitter.daemon.analysis.records import (
    AllocEvidence,
    FaultEvidence,
    FrameEvidence,
    GcEvidence,
    GilEvidence,
    IdleEvidence,
    IrqEvidence,
    MigrationEvidence,
    NodeEvidence,
    ReasonEvidence,
    SyscallEvidence,
    TaskEvidence,
)
from gpujitter.probes.events import NATIVE_LINE, NodeTime, WorkloadInfo
from gpujitter.probes.workload import Workload
from tests.fixtures.streams.synthetic import (
    CONFIG,
    MS,
    TWO_NODES,
    Stream,
    evidence,
    ns,
    parts_ms,
)

FUTEX, NANOSLEEP, READ = 202, 35, 0


def test_host_work_alone_when_the_thread_ran_throughout():
    attr = Stream().ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 40}
    assert evidence(attr, "host_work") == (NodeEvidence(node=0, cpus=(), ns=40 * MS, remote=False),)
    assert attr.remedies == (f"host_work: {remedies.host_work_hint()}",)
    assert (attr.tid, attr.tgid, attr.gpu_node, attr.tgids) == (101, 100, 0, (100,))


def test_host_work_names_the_python_functions_sampled_inside_it():
    s = Stream()
    for at in (102, 112, 122, 132):
        s.sample(at, "collate", "/job/data.py", 40)
    s.sample(136, "log_metrics", "/job/log.py", 7).sample(90, "before_the_gap").sample(145, "after")
    attr = s.ran(0, 1000).gap(100, 140).one()
    frames = [e for e in evidence(attr, "host_work") if isinstance(e, FrameEvidence)]
    assert frames == [
        FrameEvidence(func="collate", file="/job/data.py", line=40, samples=4, of=5, ns=32 * MS),
        FrameEvidence(func="log_metrics", file="/job/log.py", line=7, samples=1, of=5, ns=8 * MS),
    ]
    assert "40.00ms host work (in collate (/job/data.py:40) 80% of 5 samples)" in one_line(attr)


def test_host_work_names_a_native_frame_by_function_and_module_without_a_line():
    # Samples of a thread with no Python frame carry its native function (line NATIVE_LINE,
    # file the module's path); one in no module is its hex address with no module.
    s = Stream()
    for at in (102, 112, 122):
        s.sample(at, "gj_native_spin", "/opt/lib/libgjspin.so", NATIVE_LINE)
    s.sample(132, "0x7f00dead0000", "", NATIVE_LINE).sample(136, "collate", "/job/data.py", 40)
    attr = s.ran(0, 1000).gap(100, 140).one()
    frames = [e for e in evidence(attr, "host_work") if isinstance(e, FrameEvidence)]
    assert [f.where for f in frames] == [
        "native gj_native_spin (libgjspin.so)",
        "native 0x7f00dead0000",
        "collate (/job/data.py:40)",
    ]
    assert [f.words(0) for f in (frames[0], frames[2])] == [
        "native gj_native_spin (libgjspin.so): 60% of 5 samples, ~24.00ms",
        "Python collate (/job/data.py:40): 20% of 5 samples, ~8.00ms",
    ]
    assert "40.00ms host work (in native gj_native_spin (libgjspin.so) 60% of 5 samples)" in (
        one_line(attr)
    )


def test_gil_wait_names_a_native_frame_of_the_holder_without_a_line():
    s = Stream().gil(100, 30, holder=102, comm="worker")
    s.offcpu(100, 130, state="sleeping", syscall=202, waker=102)
    for at in (104, 114, 124):
        s.sample(at, "crunch", "/opt/lib/libcrunch.so", NATIVE_LINE, tid=102)
    attr = s.ran(0, 1000).ran(0, 1000, tid=102).gap(100, 140).one()
    (holder,) = evidence(attr, "gil_wait")
    assert holder.words(0).startswith(
        "GIL held by worker (tid 102), host work there, in native crunch (libcrunch.so): "
    )


def test_samples_inside_time_another_cause_took_are_not_host_work():
    s = Stream().sample(105, "gc_heavy").sample(125, "step").gc(100, 20)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert [e.func for e in evidence(attr, "host_work") if isinstance(e, FrameEvidence)] == ["step"]


def test_swap_in_inside_an_off_cpu_interval_is_the_swap_in_not_blocked():
    s = Stream().offcpu(100, 130, state="uninterruptible").fault(100, 30, "swap", 0x7F0000001000)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"swap_in": 30, "host_work": 10}
    assert evidence(attr, "swap_in") == (
        FaultEvidence(kind="swap", count=1, ns=30 * MS, cpus=(0,), addresses=(0x7F0000001000,)),
    )
    assert attr.top_cause == "swap_in"
    assert attr.remedies[0] == f"swap_in: {remedies.swappiness_at_most(10)}"


def test_file_backed_major_fault():
    s = Stream().offcpu(110, 122, state="uninterruptible").fault(110, 12, "file", 0x5000)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"major_fault": 12, "host_work": 28}
    assert evidence(attr, "major_fault")[0].kind == "file"
    assert attr.remedies[1] == f"major_fault: {remedies.page_cache_warm()}"


def test_minor_faults_inside_the_gap_take_their_total():
    attr = Stream().minor(100, 140, count=4000, total=20).ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"minor_faults": 20, "host_work": 20}
    assert evidence(attr, "minor_faults") == (
        FaultEvidence(kind="minor", count=4000, ns=20 * MS, cpus=(0,)),
    )
    assert f"minor_faults: {remedies.prefault()}" in attr.remedies


def test_a_window_wider_than_the_gap_is_apportioned_uniformly():
    # 20 ms of faults over [0, 200): the 40 ms gap gets a fifth, and a fifth of the count.
    attr = Stream().minor(0, 200, count=1000, total=20).ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 36, "minor_faults": 4}
    assert evidence(attr, "minor_faults")[0].count == 200


def test_windowed_time_goes_only_where_the_thread_was_on_cpu():
    # IRQ window [90, 150) holds 10 ms; the thread was off CPU 100-140, so the IRQs can only
    # have hit it in [90, 100) and [140, 150): none falls in the first gap, half in the second.
    s = Stream().offcpu(100, 140, syscall=FUTEX).irq(90, 150, 36, "nvme0q1", 20, 10)
    s.ran(0, 1000).gap(100, 140).gap(140, 150)
    first, second = s.attribute()
    assert parts_ms(first) == {"blocked": 40}
    assert parts_ms(second) == {"irq": 5, "host_work": 5}


def test_irq_remote_to_the_gpu_node_names_the_irq_and_moves_it_to_its_own_node():
    s = Stream().irq(110, 120, 36, "nvme0q1", count=50, total=10, cpu=0, remote=False)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 30, "irq": 10}
    assert evidence(attr, "irq") == (
        IrqEvidence(
            irq_kind="hardirq",
            irq=36,
            name="nvme0q1",
            cpus=(0,),
            count=50,
            ns=10 * MS,
            device_node=1,
            remote_to_gpu=True,
            handled_remote=False,
        ),
    )
    # Off the feeding CPU, onto the NVMe's own node.
    assert attr.remedies == (
        f"host_work: {remedies.host_work_hint()}",
        f"irq: {remedies.irq_affinity(36, [2, 3])}",
    )
    assert attr.remedies[1] == "irq: echo 2-3 > /proc/irq/36/smp_affinity_list"


def test_irq_local_to_the_gpu_moves_to_the_other_gpu_local_cpus():
    s = Stream().irq(100, 140, 25, "nvidia", count=400, total=30, cpu=0, remote=True)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"irq": 30, "host_work": 10}
    (ev,) = evidence(attr, "irq")
    assert (ev.device_node, ev.remote_to_gpu, ev.handled_remote) == (0, False, True)
    assert attr.remedies == (
        "irq: echo 1 > /proc/irq/25/smp_affinity_list",
        f"host_work: {remedies.host_work_hint()}",
    )


def test_softirq_and_vectors_move_the_feeding_process_instead():
    s = Stream().irq(100, 140, 3, "NET_RX", count=900, total=24, cpu=0, kind="softirq")
    s.irq(100, 140, 236, "LOC", count=40, total=4, cpu=0, kind="vector")
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"irq": 28, "host_work": 12}
    assert [(e.name, e.ns, e.device_node) for e in evidence(attr, "irq")] == [
        ("NET_RX", 24 * MS, -1),
        ("LOC", 4 * MS, -1),
    ]
    assert attr.remedies[0] == f"irq: {remedies.move_away(100, [1])}"
    assert attr.remedies[0] == "irq: taskset -acp 1 100"


def test_runq_wait_names_the_task_that_ran_instead():
    s = Stream().offcpu(100, 125, runnable=100, state="preempted", other=555, other_comm="hog")
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"runq_wait": 25, "host_work": 15}
    assert evidence(attr, "runq_wait") == (
        TaskEvidence(tid=555, comm="hog", cpus=(0,), count=1, ns=25 * MS, after_migration=False),
    )
    assert attr.remedies[0] == f"runq_wait: {remedies.move_away(555, [1, 2, 3])}"


def test_runq_wait_never_moves_the_competitor_onto_another_gpus_process():
    # GPU 1's process (200: another rank) runs on CPU 1: the hog goes to 2-3, not 1-3.
    s = Stream().offcpu(100, 125, runnable=100, state="preempted", other=555, other_comm="hog")
    s.procs(0, (100,)).procs(0, (200,), gpu=1)
    s.add(*Stream(tid=201, tgid=200).offcpu(50, 60, cpu=1).events)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert attr.remedies[0] == f"runq_wait: {remedies.move_away(555, [2, 3])}"


def test_runq_wait_after_a_cross_numa_migration_is_flagged_with_the_migration():
    s = Stream().migrate(98, 0, 2)
    s.offcpu(100, 125, runnable=100, state="preempted", cpu=2, other=555, other_comm="hog")
    attr = s.ran(0, 1000, node=1).gap(100, 140).one()
    assert parts_ms(attr)["runq_wait"] == 25
    task, move = evidence(attr, "runq_wait")
    assert isinstance(task, TaskEvidence) and task.after_migration
    assert move == MigrationEvidence(
        at_ns=ns(98), tid=101, src_cpu=0, dst_cpu=2, src_node=0, dst_node=1
    )
    assert attr.remedies[0] == f"runq_wait: {remedies.bind_process(100, 0, [0, 1])}"


def test_runq_wait_on_a_cpu_of_another_node_is_flagged_without_a_migration_event():
    s = Stream().offcpu(100, 120, runnable=110, cpu=0, cpu_in=3, other=7, other_comm="kworker")
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert evidence(attr, "runq_wait")[0].after_migration


def test_remote_on_cpu_time_follows_the_thread_to_the_remote_node():
    # Moved to CPU 2 (node 1) at 90 ms, back to CPU 0 at 130 ms: 30 ms of the gap ran remote.
    s = Stream().migrate(90, 0, 2).migrate(130, 2, 0)
    s.add(*Stream().ran(0, 1000).events)  # on CPU throughout...
    s.events[-1] = type(s.events[-1])(  # ...split 960 / 40 ms between the nodes
        ts_ns=ns(0), interval_ns=1000 * MS, tid=101, tgid=100, node_ns=((0, 960 * MS), (1, 40 * MS))
    )
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"remote_oncpu": 30, "host_work": 10}
    node, move = evidence(attr, "remote_oncpu")
    assert node == NodeEvidence(node=1, cpus=(2,), ns=30 * MS, remote=True)
    assert move == MigrationEvidence(
        at_ns=ns(90), tid=101, src_cpu=0, dst_cpu=2, src_node=0, dst_node=1
    )
    assert attr.remedies[0] == "remote_oncpu: taskset -acp 0-1 100 && migratepages 100 all 0"


def test_the_override_places_gpu_minus_1_so_remote_time_is_found() -> None:
    # The stub libcuda's GPU has no bus id (gaps on GPU -1): only the override's
    # `[gpus] unknown = 0` says its node, and with it the time on node 1 is remote.
    placed = replace(TWO_NODES, unknown_gpu_node=0, override="split.toml")
    for topology, remote in ((placed, True), (TWO_NODES, False)):
        s = Stream(topology).migrate(90, 0, 2).migrate(130, 2, 0)
        s.add(*Stream(topology).ran(0, 1000).events)
        s.events[-1] = replace(s.events[-1], node_ns=((0, 960 * MS), (1, 40 * MS)))
        attr = s.gap(100, 140, gpu=UNKNOWN_GPU).one()
        assert attr.gpu == UNKNOWN_GPU
        assert attr.gpu_node == (0 if remote else -1)
        assert ("remote_oncpu" in parts_ms(attr)) is remote, parts_ms(attr)
    assert parts_ms(attr) == {"host_work": 40}  # unplaced: nothing is remote


def test_without_a_placement_on_cpu_time_splits_by_the_windows_node_shares():
    s = Stream()
    s.add(
        type(Stream().ran(0, 1).events[0])(
            ts_ns=ns(0),
            interval_ns=1000 * MS,
            tid=101,
            tgid=100,
            node_ns=((0, 750 * MS), (1, 250 * MS)),
        )
    )
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 30, "remote_oncpu": 10}
    assert evidence(attr, "remote_oncpu") == (
        NodeEvidence(node=1, cpus=(), ns=10 * MS, remote=True),
    )


def test_idle_wake_delay_names_the_state_and_limits_idle_latency():
    s = Stream().offcpu(100, 120, runnable=115, cpu=0, cpu_in=1, syscall=NANOSLEEP)
    s.idle(115, 5, cpu=1, state=2, name="C6", exit_latency_us=133)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 20, "blocked": 15, "idle_wake": 5}
    assert evidence(attr, "idle_wake") == (
        IdleEvidence(
            state=2, state_name="C6", cpus=(1,), count=1, ns=5 * MS, exit_latency_ns=133_000
        ),
    )
    assert evidence(attr, "blocked") == (
        SyscallEvidence(state="sleeping", syscall="nanosleep", nr=NANOSLEEP, count=1, ns=15 * MS),
    )


def test_idle_wake_without_a_reported_off_cpu_interval_still_counts():
    attr = Stream().idle(120, 8, cpu=1).ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 32, "idle_wake": 8}
    assert attr.remedies[1] == f"idle_wake: {remedies.limit_idle_latency(133)}"


def test_allocator_syscall_stall():
    attr = Stream().alloc(105, 12, "munmap", size=1 << 30).ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 28, "alloc_stall": 12}
    assert evidence(attr, "alloc_stall") == (
        AllocEvidence(call="munmap", allocator="", count=1, ns=12 * MS, bytes=1 << 30),
    )
    assert attr.remedies[1] == f"alloc_stall: {remedies.allocator()}"


def test_allocator_uprobe_call_stall():
    attr = Stream().alloc_call(100, 30, "malloc").ran(0, 1000).gap(100, 140).one()
    assert evidence(attr, "alloc_stall") == (
        AllocEvidence(call="malloc", allocator="glibc", count=1, ns=30 * MS, bytes=64 << 20),
    )


def test_gc_collection_is_carved_out_of_host_work():
    attr = Stream().gc(105, 12).gc(125, 8, generation=0).ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 20, "gc_pause": 20}
    assert evidence(attr, "gc_pause") == (
        GcEvidence(generation=2, count=1, ns=12 * MS, dur_ns=12 * MS, collected=1000),
        GcEvidence(generation=0, count=1, ns=8 * MS, dur_ns=8 * MS, collected=1000),
    )
    assert f"gc_pause: {remedies.gc_pause(evidence(attr, 'gc_pause')[0])}" in attr.remedies


def test_gc_takes_only_the_on_cpu_time_inside_a_collection():
    # Preempted 5 ms inside the collection: that is the hog's; of the thread's on-CPU time
    # (half of the rest) the collection's share is GC, the other half unexplained, as
    # host work would leave it.
    s = Stream().gc(100, 20)
    s.offcpu(105, 110, runnable=105, state="preempted", other=9, other_comm="hog")
    attr = s.ran(0, 1000, share=0.5).gap(100, 140).one()
    assert parts_ms(attr) == {"gc_pause": 7.5, "runq_wait": 5, "host_work": 10, "unexplained": 17.5}


def test_gil_wait_names_the_holder_and_what_it_did():
    # The feeder sleeps on the GIL's condition variable for 30 ms (off CPU, woken by the
    # holder, which a blocked wait would follow into); the holder runs Python all along.
    s = Stream().gil(100, 30, holder=102, comm="logger")
    s.offcpu(100, 130, state="sleeping", syscall=202, waker=102)
    s.ran(0, 1000).ran(0, 1000, tid=102)
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"gil_wait": 30, "host_work": 10}
    assert evidence(attr, "gil_wait") == (
        GilEvidence(102, "logger", count=1, ns=30 * MS, dur_ns=30 * MS,
                    holder_cause="host_work", holder_cause_ns=30 * MS),
    )  # fmt: skip
    assert f"gil_wait: {remedies.gil_wait(evidence(attr, 'gil_wait')[0])}" in attr.remedies


def test_gil_wait_names_the_python_function_the_holder_ran():
    # The holder (python_stacks samples it too) spends the wait in log_batch; its sample
    # after the wait, and the waiter's own, are not the holder's during the wait.
    s = Stream().gil(100, 30, holder=102, comm="logger")
    s.offcpu(100, 130, state="sleeping", syscall=202, waker=102)
    for at in (104, 114, 124):
        s.sample(at, "log_batch", "/job/log.py", 12, tid=102)
    s.sample(128, "flush", "/job/log.py", 30, tid=102).sample(135, "after", tid=102)
    s.sample(110, "waiter_frame")
    attr = s.ran(0, 1000).ran(0, 1000, tid=102).gap(100, 140).one()
    (holder,) = evidence(attr, "gil_wait")
    frame = (holder.holder_func, holder.holder_file, holder.holder_line)
    assert frame == ("log_batch", "/job/log.py", 12)
    assert holder.words(0).startswith(
        "GIL held by logger (tid 102), host work there, in log_batch (/job/log.py:12): "
    )
    assert (
        "30.00ms Python GIL wait (held by logger (tid 102), host work there, in log_batch"
        in one_line(attr)
    )


def test_runq_wait_inside_a_gil_wait_stays_contention():
    s = Stream().gil(100, 30)
    s.offcpu(100, 130, runnable=120, state="sleeping", other=9, other_comm="hog")
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"runq_wait": 10, "gil_wait": 20, "host_work": 10}
    (holder,) = evidence(attr, "gil_wait")
    assert (holder.holder_tid, holder.holder_cause) == (0, "")


def test_irq_inside_a_collection_is_the_irq():
    s = Stream().gc(100, 20).irq(100, 120, 36, "nvme0q1", count=10, total=5)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 20, "gc_pause": 15, "irq": 5}


def test_blocked_otherwise_carries_the_syscall():
    s = Stream().offcpu(100, 130, state="uninterruptible", syscall=READ)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"blocked": 30, "host_work": 10}
    assert evidence(attr, "blocked") == (
        SyscallEvidence(state="uninterruptible", syscall="read", nr=READ, count=1, ns=30 * MS),
    )
    assert attr.remedies[0] == f"blocked: {remedies.blocked_hint('read', 'uninterruptible')}"


def test_no_on_cpu_data_is_unexplained_never_spread():
    s = Stream().offcpu(100, 110, syscall=FUTEX)
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"unexplained": 30, "blocked": 10}
    assert evidence(attr, "unexplained") == (ReasonEvidence(reason="no_data", ns=30 * MS),)


def test_time_the_thread_neither_ran_nor_reported_is_unexplained_short_offcpu():
    attr = Stream().ran(0, 1000, share=0.5).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 20, "unexplained": 20}
    assert evidence(attr, "unexplained") == (ReasonEvidence(reason="short_offcpu", ns=20 * MS),)


def test_irq_and_fault_time_count_against_the_on_cpu_budget():
    # The thread ran half the time; 10 ms of that were IRQs. Host work is the other 10 ms.
    s = Stream().irq(100, 140, 36, "nvme0q1", count=10, total=10).ran(0, 1000, share=0.5)
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"unexplained": 20, "irq": 10, "host_work": 10}


def test_irq_inside_an_allocator_call_is_the_irq():
    s = Stream().alloc(100, 20).irq(100, 120, 36, "nvme0q1", count=10, total=5)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 20, "alloc_stall": 15, "irq": 5}


def test_preemption_inside_an_allocator_call_is_the_run_queue_wait():
    s = Stream().alloc(100, 20)
    s.offcpu(105, 110, runnable=105, state="preempted", other=9, other_comm="hog")
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 20, "alloc_stall": 15, "runq_wait": 5}


def test_swap_in_spanning_blocked_and_runq_parts_takes_both():
    s = Stream().offcpu(100, 130, runnable=125, state="uninterruptible", other=9, other_comm="x")
    s.fault(100, 28, "swap", 0x1000)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"swap_in": 28, "host_work": 10, "runq_wait": 2}


def test_intervals_crossing_the_gap_edges_are_clipped():
    s = Stream().offcpu(80, 110, syscall=FUTEX).offcpu(135, 160, runnable=135, state="preempted")
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 25, "blocked": 10, "runq_wait": 5}


def test_gap_with_no_feeding_thread_is_unexplained_no_thread():
    attr = Stream().ran(0, 1000).gap(100, 140, tid_after=0, tgids=()).one()
    assert parts_ms(attr) == {"unexplained": 40}
    assert evidence(attr, "unexplained") == (ReasonEvidence(reason="no_thread", ns=40 * MS),)
    assert (attr.tid, attr.threads, attr.remedies) == (0, (), ())


def test_feeding_thread_known_but_never_seen_is_unexplained_no_data():
    attr = Stream().gap(100, 140, tid_after=4242).one()
    assert parts_ms(attr) == {"unexplained": 40}
    assert evidence(attr, "unexplained")[0].reason == "no_data"
    assert attr.tid == 4242


def test_without_launching_tids_the_processes_latest_launcher_is_critical():
    s = Stream().launch(50, tid=101).launch(90, tid=102).ran(0, 1000, tid=102)
    s.offcpu(100, 130, syscall=FUTEX, tid=101).ran(0, 1000, tid=101)
    attr = s.gap(100, 140, tid_after=0, tgids=()).procs(10, (100,)).one()
    assert (attr.tid, attr.tgids) == (102, (100,))
    assert parts_ms(attr) == {"host_work": 40}
    assert [(r.tid, r.role, r.top_cause, r.ns) for r in attr.threads] == [
        (102, "critical", "host_work", 40 * MS),
        (101, "sibling", "blocked", 30 * MS),
    ]


def test_probes_not_running_are_named_and_drive_the_unexplained_remedy():
    s = Stream().status(0, "sched", "running").status(0, "faults", "unavailable")
    attr = s.gap(100, 140).one()
    assert attr.probes_off == ("faults",)
    assert attr.remedies == (f"unexplained: {remedies.enable_probes(['faults'])}",)


def test_a_degraded_probe_still_delivers_and_is_not_named_off():
    # degraded: running with less detail (sched without the blocked-in syscall, cstate
    # without exit latencies); its causes are still seen
    s = Stream().status(0, "sched", "degraded").status(0, "cstate", "degraded")
    attr = s.status(0, "faults", "off").gap(100, 140).one()
    assert attr.probes_off == ("faults",)


# -- several threads: the critical path follows wakers; other threads are evidence ----------


def roles(attr):
    return [(r.tid, r.role, r.top_cause, r.ns / MS) for r in attr.threads]


def part(attr, cause):
    return next(p for p in attr.parts if p.cause == cause)


def test_a_futex_wait_is_explained_by_what_the_watched_waker_was_doing():
    s = Stream().offcpu(90, 140, syscall=FUTEX, waker=102)
    s.offcpu(95, 125, state="uninterruptible", tid=102).fault(95, 30, "swap", 0x2000, tid=102)
    attr = s.ran(0, 1000).ran(0, 1000, tid=102).gap(100, 140).one()
    assert parts_ms(attr) == {"swap_in": 25, "host_work": 15}
    assert part(attr, "swap_in").tids == (102,)
    assert roles(attr) == [(101, "critical", "swap_in", 40), (102, "waker", "swap_in", 40)]


def test_what_the_waker_cannot_explain_stays_blocked_for_the_critical_thread():
    s = Stream().offcpu(90, 140, syscall=FUTEX, waker=102)
    s.offcpu(95, 125, state="uninterruptible", tid=102).fault(95, 30, "swap", 0x2000, tid=102)
    attr = s.ran(0, 1000).gap(100, 140).one()  # no on-CPU data for 102
    assert parts_ms(attr) == {"swap_in": 25, "blocked": 15}
    assert part(attr, "blocked").tids == (101,)
    assert roles(attr) == [(101, "critical", "swap_in", 40), (102, "waker", "swap_in", 25)]


def second_of_102(start: float, oncpu_ms: int) -> NodeTime:
    """Thread 102's on-CPU window of a second from `start`."""
    return NodeTime(
        ts_ns=ns(start), interval_ns=1000 * MS, tid=102, tgid=100, node_ns=((0, oncpu_ms * MS),)
    )


def waker_asleep_after(still_off: bool) -> Stream:
    """101 waits on a futex for 102, which computes until 139 ms, wakes it and sleeps on
    past the attribution (its OffCpu comes at its wake-up, later); 102's on-CPU window of
    the second holds those 139 ms."""
    s = Stream().offcpu(100, 140, syscall=FUTEX, waker=102).ran(0, 1000)
    s.add(second_of_102(0, 139))
    if still_off:
        s.still_off(139, as_of=1000, tid=102)
    return s.gap(100, 140)


def test_a_waker_still_asleep_has_its_cpu_time_where_it_was_awake():
    """Announced asleep from 139 ms, the waker's 139 ms of the second lie in [0, 139): all
    of the wait up to then is its host work. Without the announcement the 139 ms spread
    over the whole second, as if it might have run while it slept, and most of the wait
    read as blocked."""
    assert parts_ms(waker_asleep_after(still_off=True).one()) == {"host_work": 39, "blocked": 1}
    unknown = parts_ms(waker_asleep_after(still_off=False).one())
    assert unknown["blocked"] > 34 and unknown["host_work"] < 6


def test_an_interval_announced_open_gives_way_to_what_came_since():
    # Its OffCpu came already (same stamp): the record itself says it all.
    s = waker_asleep_after(still_off=False).offcpu(139, 2000, tid=102).still_off(139, 1000, tid=102)
    assert parts_ms(s.one()) == {"host_work": 39, "blocked": 1}
    # A window in which it ran came after it was found asleep: it woke since (the OffCpu
    # lost), so the announcement no longer holds and the earlier window spreads as before.
    s = waker_asleep_after(still_off=True)
    s.add(second_of_102(1000, 5))
    assert parts_ms(s.one()) == parts_ms(waker_asleep_after(still_off=False).one())


def test_an_announcement_alone_makes_no_thread_known():
    """Announced asleep before any span of its own, a thread is no waker to follow and no
    timeline; its first span picks the announcement up."""
    engine = Engine(TWO_NODES, CONFIG)
    for ev in Stream().still_off(139, as_of=1000, tid=102).events:
        engine.feed(ev)
    assert engine.stats().threads == 0
    for ev in waker_asleep_after(still_off=False).in_emission_order():
        engine.feed(ev)
    (attr,) = engine.flush()
    assert parts_ms(attr) == {"host_work": 39, "blocked": 1}


def loader_chain() -> Stream:
    """A DataLoader's shape: the trainer (101) waits on a futex for the pin-memory thread
    (102), which waits in a pipe read for the worker process's queue feeder thread (302),
    which waits on a futex for the worker's main thread (301), busy computing the batch."""
    s = Stream().offcpu(100, 140, syscall=FUTEX, waker=102, comm="trainer")
    s.offcpu(60, 139, syscall=READ, waker=302, tid=102, comm="pin_memory")
    s.ran(0, 1000).ran(0, 1000, tid=102)
    worker = Stream(tid=301, tgid=300)
    worker.offcpu(60, 138, syscall=FUTEX, waker=301, tid=302, comm="QueueFeederThr")
    worker.offcpu(70, 102, syscall=READ, waker=0, comm="pt_data_worker")
    worker.ran(0, 1000).ran(0, 1000, tid=302)
    return s.add(*worker.events).gap(100, 140)


def test_a_wait_is_followed_across_processes_to_the_busy_worker():
    attr = loader_chain().one()
    assert parts_ms(attr) == {"host_work": 38, "blocked": 2}
    assert part(attr, "host_work").tids == (102, 301, 302)
    assert part(attr, "blocked").tids == (301,)  # before its index came: woken by nobody watched
    worker = next(r for r in attr.threads if r.tid == 301)
    assert (worker.tgid, worker.comm, worker.role, worker.hops, worker.woke) == (
        300, "pt_data_worker", "waker", 3, 302,
    )  # fmt: skip
    assert [(c.cause, c.ns / MS) for c in worker.causes] == [("host_work", 36), ("blocked", 2)]
    assert [(r.tid, r.hops, r.woke) for r in attr.threads] == [
        (101, 0, 0), (301, 3, 302), (102, 1, 101), (302, 2, 102),
    ]  # fmt: skip


def test_following_wakers_stops_when_the_gaps_budget_is_spent():
    s = loader_chain()
    # Each hop sweeps two segments (blocked, then on CPU) and costs one more for the visit: a
    # budget of 7 reaches the worker's feeder thread, not the worker's main thread.
    attr = s.one(replace(CONFIG, waker_budget=7))
    assert parts_ms(attr) == {"blocked": 38, "host_work": 2}
    assert part(attr, "blocked").tids == (302,)
    assert 301 not in [r.tid for r in attr.threads]
    engine = Engine(TWO_NODES, replace(CONFIG, waker_budget=7))
    for ev in s.in_emission_order():
        engine.feed(ev)
    engine.flush()
    assert engine.stats().follow_cut == 1


def test_a_chain_of_wakers_longer_than_the_hop_cap_ends_blocked():
    s = Stream()
    for k in range(MAX_HOPS + 2):  # each thread woken by the next; the last one computes
        s.offcpu(90, 140, syscall=FUTEX, waker=102 + k, tid=101 + k)
    s.ran(0, 1000, tid=101 + MAX_HOPS + 2)
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"blocked": 40}
    assert part(attr, "blocked").tids == (101 + MAX_HOPS,)


def test_threads_waiting_on_each_other_end_in_blocked():
    s = Stream().offcpu(90, 140, syscall=FUTEX, waker=102)
    s.offcpu(90, 140, syscall=FUTEX, waker=101, tid=102)
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"blocked": 40}
    assert part(attr, "blocked").tids == (102,)


def test_timed_sleeps_and_io_waits_are_not_followed_into_the_waker():
    s = Stream().offcpu(90, 120, syscall=NANOSLEEP, waker=102)
    s.offcpu(120, 140, state="uninterruptible", syscall=READ, waker=102)
    s.offcpu(90, 140, state="uninterruptible", tid=102).fault(90, 50, "swap", 0x3000, tid=102)
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"blocked": 40}
    assert [e.syscall for e in evidence(attr, "blocked")] == ["nanosleep", "read"]


def test_the_thread_that_launched_before_and_siblings_are_evidence_not_parts():
    s = Stream().ran(0, 1000)
    s.offcpu(100, 130, state="uninterruptible", tid=103).fault(100, 30, "swap", 0x9000, tid=103)
    s.offcpu(100, 112, state="preempted", runnable=100, other=9, tid=104).ran(0, 1000, tid=104)
    s.ran(0, 1000, tid=105)  # only on-CPU windows: no events inside the gap
    attr = s.gap(100, 140, tid_before=103).one()
    assert parts_ms(attr) == {"host_work": 40}
    assert roles(attr) == [
        (101, "critical", "host_work", 40),
        (103, "before", "swap_in", 30),
        (104, "sibling", "host_work", 28),
    ]


def test_the_listed_threads_are_capped():
    s = Stream().ran(0, 1000)
    for tid in range(110, 130):
        s.offcpu(100, 100 + tid - 100, syscall=FUTEX, tid=tid)
    attr = s.gap(100, 140).one(replace(CONFIG, max_threads_listed=3))
    assert [(r.tid, r.ns / MS) for r in attr.threads] == [(101, 40), (129, 29), (128, 28)]


def test_the_worked_example_in_docs_attribution_md():
    s = Stream()
    s.offcpu(102, 120, syscall=FUTEX, waker=102, comm="trainer")
    s.offcpu(95, 118, state="uninterruptible", cpu=1, tid=102, comm="loader")
    s.fault(95, 23, "swap", 0x7F3A5C200000, cpu=1, tid=102)
    s.irq(120, 128, 36, "nvme0q1", count=240, total=6, cpu=0)
    s.offcpu(
        128, 136, runnable=128, state="preempted", other=555, other_comm="stress", comm="trainer"
    )
    s.ran(0, 1000, share=0.95).ran(0, 1000, tid=102)
    attr = s.gap(100, 150).one()
    assert parts_ms(attr) == {
        "host_work": 18.8,
        "swap_in": 16,
        "runq_wait": 8,
        "irq": 6,
        "unexplained": 1.2,
    }
    assert roles(attr) == [(101, "critical", "host_work", 50), (102, "waker", "swap_in", 18)]
    assert [r.comm for r in attr.threads] == ["trainer", "loader"]
    assert attr.remedies[1] == f"swap_in: {remedies.swappiness_at_most(10)}"


def test_a_wake_up_delay_during_which_another_task_ran_is_contention():
    s = Stream().offcpu(100, 120, runnable=110, cpu_in=1, other=555, other_comm="hog")
    s.idle(110, 10, cpu=1)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 20, "runq_wait": 10, "blocked": 10}


def test_a_named_launcher_without_events_gives_way_to_the_other_named_one():
    s = Stream().ran(0, 1000, tid=103)
    attr = s.gap(100, 140, tid_after=4242, tid_before=103).one()
    assert (attr.tid, parts_ms(attr)) == (103, {"host_work": 40})


def test_a_placement_the_on_cpu_windows_contradict_yields_to_their_proportions():
    # Last seen on CPU 2 (node 1), but the window saw no time on node 1: a migration the
    # probe missed. The window's own split (all node 0) decides.
    s = Stream().offcpu(50, 60, cpu=2, cpu_in=2).ran(0, 1000, node=0)
    attr = s.gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 40}


def test_an_irq_window_shorter_than_its_total_is_widened_to_hold_it():
    # One 8 ms handler reported as first = last = 110 ms: it took [110, 118).
    attr = Stream().irq(110, 110, 36, "nvme0q1", 1, 8).ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 32, "irq": 8}
    attr = Stream().irq(136, 136, 36, "nvme0q1", 1, 8).ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 36, "irq": 4}


def test_syscall_names_follow_the_traced_hosts_abi():
    s = Stream().offcpu(100, 140, syscall=98).gap(100, 140)
    assert evidence(s.one(), "blocked")[0].syscall == "syscall 98"
    arm = s.one(replace(CONFIG, syscall_abi="arm64"))
    assert evidence(arm, "blocked")[0].syscall == "futex"


def test_a_thread_waiting_to_run_takes_no_irq_time():
    # No off-CPU event (below threshold) but a wake-up delay [120, 128): the IRQ window's
    # share of those 8 ms is the delay's; the IRQs took their time elsewhere in the window.
    s = Stream().idle(120, 8).irq(100, 140, 36, "nvme0q1", count=40, total=8)
    attr = s.ran(0, 1000).gap(100, 140).one()
    assert parts_ms(attr) == {"host_work": 25.6, "idle_wake": 8, "irq": 6.4}


def test_the_task_that_ran_instead_carries_its_process_and_workload():
    """A hog in another tenant's container: the evidence names its process and container,
    the one-liner says where it runs, and the remedy moves its whole process."""
    hog = WorkloadInfo(ts_ns=ns(1), tgid=550, workload=Workload(kind="container",
                       container_id="ab" * 32, runtime="docker"))  # fmt: skip
    s = Stream().add(hog).offcpu(100, 125, runnable=100, state="preempted", other=555,
                                 other_comm="hog", other_tgid=550)  # fmt: skip
    attr = s.ran(0, 1000).gap(100, 140).one()
    (task,) = evidence(attr, "runq_wait")
    assert (task.tid, task.tgid, task.workload) == (555, 550, "docker abababababab")
    assert "behind hog (pid 550 tid 555) in docker abababababab on CPU 0" in one_line(attr)
    assert attr.remedies[0] == f"runq_wait: {remedies.move_away(550, [1, 2, 3])}"
    # Unknown process (a record from before schema 1.6): named by its thread, as before.
    old = Stream().offcpu(100, 125, runnable=100, state="preempted", other=555, other_comm="hog")
    (task,) = evidence(old.ran(0, 1000).gap(100, 140).one(), "runq_wait")
    assert (task.tgid, task.workload) == (0, "")
