"""Every attribution remedy against the situation that would make the naive command harmful:
a competitor moved onto the job's other CPUs, an IRQ sent there, memory bound to an
emulated node, swappiness raised, idle states disabled for an unknown latency, THP turned
off for 4 KiB faults, jemalloc preloaded over an allocator already in use."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gpujitter.daemon.analysis.engine.causes import CAUSE_BY_NAME
from gpujitter.daemon.analysis.records import (
    AllocEvidence,
    Evidence,
    FaultEvidence,
    GcEvidence,
    GilEvidence,
    IdleEvidence,
    IoEvidence,
    IrqEvidence,
    Part,
    ReasonEvidence,
    SyscallEvidence,
    TaskEvidence,
)
from gpujitter.daemon.analysis.remedies import RemedyContext
from gpujitter.probes.host import parse_cpulist
from gpujitter.probes.topology import Topology
from tests.fixtures.streams.synthetic import MS, Stream

# Node 0: CPUs 0-3 (the GPU's), node 1: CPUs 4-7. The job (process 100: threads 101, 102)
# ran on CPUs 0-3; its launch thread 101 waited on CPU 3.
TOPO = Topology(cpu_node={c: c // 4 for c in range(8)}, irq_node={36: 0}, gpu_node={})
JOB = RemedyContext(
    topology=TOPO,
    gpu_node=0,
    tgid=100,
    feeding_cpus=(3,),
    probes_off=(),
    job_tids=frozenset({101, 102}),
    job_cpus=(0, 1, 2, 3),
)
OVERRIDE = replace(JOB, topology=replace(TOPO, override="/etc/gpujitter/2node.toml"))
EVERYWHERE = replace(JOB, job_cpus=tuple(range(8)))
UNKNOWN_GPU_NODE_JOB_ON_1 = replace(JOB, gpu_node=None, feeding_cpus=(4,), job_cpus=(4, 5))


def task(tid: int, comm: str, after_migration: bool = False) -> TaskEvidence:
    return TaskEvidence(tid, comm, cpus=(3,), count=1, ns=10 * MS, after_migration=after_migration)


def irq(kind: str, n: int, name: str, node: int = -1) -> IrqEvidence:
    return IrqEvidence(kind, n, name, cpus=(3,), count=100, ns=10 * MS, device_node=node)


def cpus_of_taskset(line: str, pid: int) -> set[int]:
    m = re.search(rf"taskset -acp (\S+) {pid}\b", line)
    assert m, line
    return set(parse_cpulist(m[1]))


def cpus_of_irq(line: str, n: int) -> set[int]:
    m = re.search(rf"echo (\S+) > /proc/irq/{n}/smp_affinity_list", line)
    assert m, line
    return set(parse_cpulist(m[1]))


@dataclass(frozen=True)
class Case:
    cause: str
    evidence: Evidence
    ctx: RemedyContext
    check: Callable[[str | None], object]


CASES = {
    # runq_wait: never onto the job's other CPUs (the bug: taskset -acp 0-2,4-7 555).
    "hog off the job's CPUs": Case(
        "runq_wait", task(555, "stress"), JOB,
        lambda line: cpus_of_taskset(line, 555) == {4, 5, 6, 7},
    ),
    # Another GPU's process (a rank of the same job, another job) runs on CPUs 4-5: moved
    # there, the hog would stall that GPU instead.
    "hog off the other GPUs' processes' CPUs too": Case(
        "runq_wait", task(555, "stress"), replace(JOB, others_cpus=(4, 5)),
        lambda line: cpus_of_taskset(line, 555) == {6, 7},
    ),
    "no CPU free of this job and the others: isolate": Case(
        "runq_wait", task(555, "stress"), replace(JOB, others_cpus=(4, 5, 6, 7)),
        lambda line: "taskset" not in line and "other GPUs' processes (0-7)" in line,
    ),
    "no CPU free of the job: isolate, do not move": Case(
        "runq_wait", task(555, "stress"), EVERYWHERE,
        lambda line: "taskset" not in line and "renice -n 19 -p 555" in line
        and "AllowedCPUs=" in line,
    ),
    # taskset -a on the job's own thread would move the whole job.
    "the job's own thread": Case(
        "runq_wait", task(102, "loader"), JOB,
        lambda line: "taskset" not in line and "102" in line,
    ),
    # A per-CPU kernel thread cannot be moved: the job leaves its CPU instead.
    "a per-CPU kernel thread": Case(
        "runq_wait", task(33, "ksoftirqd/3"), JOB,
        lambda line: " 33" not in line and cpus_of_taskset(line, 100) == {0, 1, 2},
    ),
    # A threaded IRQ handler follows its IRQ: move the IRQ, off the job's CPUs.
    "a threaded IRQ handler": Case(
        "runq_wait", task(40, "irq/36-nvme0q1"), JOB,
        lambda line: cpus_of_irq(line, 36) == {4, 5, 6, 7},
    ),
    # Emulated nodes have no memory of their own: no migratepages, no --membind.
    "after a migration, nodes emulated": Case(
        "runq_wait", task(555, "stress", after_migration=True), OVERRIDE,
        lambda line: cpus_of_taskset(line, 100) == {0, 1, 2, 3} and "migratepages" not in line
        and "2node.toml" in line,
    ),
    "remote on-CPU, nodes emulated": Case(
        "remote_oncpu", irq("softirq", 3, "NET_RX"), OVERRIDE,  # evidence unused
        lambda line: "migratepages" not in line and "membind" not in line,
    ),
    "remote on-CPU, real nodes": Case(
        "remote_oncpu", irq("softirq", 3, "NET_RX"), JOB,
        lambda line: line == "taskset -acp 0-3 100 && migratepages 100 all 0",
    ),
    # The device's node is all job CPUs: the IRQ goes to CPUs free of the job, not 0-2.
    "a hard IRQ whose node the job fills": Case(
        "irq", irq("hardirq", 36, "nvme0q1", node=0), JOB,
        lambda line: cpus_of_irq(line, 36) == {4, 5, 6, 7},
    ),
    "a hard IRQ where every CPU runs the job": Case(
        "irq", irq("hardirq", 36, "nvme0q1", node=0), EVERYWHERE,
        lambda line: 3 not in cpus_of_irq(line, 36) and "every CPU runs the job" in line,
    ),
    # GPU node unknown: the job stays on the node it ran on rather than spreading remote.
    "a softirq, GPU node unknown": Case(
        "irq", replace(irq("softirq", 3, "NET_RX"), cpus=(4,)), UNKNOWN_GPU_NODE_JOB_ON_1,
        lambda line: cpus_of_taskset(line, 100) == {5, 6, 7},
    ),
    # Timer ticks come to any CPU: moving the job would not help.
    "a local timer vector": Case(
        "irq", irq("vector", 236, "LOC"), JOB,
        lambda line: "taskset" not in line and "nohz_full" in line,
    ),
    "4 KiB first-touch faults: THP stays": Case(
        "minor_faults", FaultEvidence("minor", count=10_000, ns=25 * MS, cpus=(3,)), JOB,
        lambda line: "transparent_hugepage" not in line and "pre-fault" in line,
    ),
    "slow huge-page faults: no compaction in the fault path": Case(
        "minor_faults", FaultEvidence("minor", count=100, ns=25 * MS, cpus=(3,)), JOB,
        lambda line: "never > /sys/kernel/mm/transparent_hugepage/defrag" in line
        and "/enabled" not in line,
    ),
    # Disabling every state of latency >= 1 us for a latency nobody knows.
    "HLT without a cpuidle driver": Case(
        "idle_wake", IdleEvidence(1, "HLT", (3,), 40, 2 * MS, exit_latency_ns=-1), JOB,
        lambda line: "cpupower" not in line and "haltpoll" in line,
    ),
    "POLL has no exit latency": Case(
        "idle_wake", IdleEvidence(0, "POLL", (3,), 40, 2 * MS, exit_latency_ns=0), JOB,
        lambda line: "cpupower" not in line,
    ),
    "C6 at 133 us": Case(
        "idle_wake", IdleEvidence(3, "C6", (3,), 40, 2 * MS, exit_latency_ns=133_000), JOB,
        lambda line: line == "cpupower idle-set -D 133",
    ),
    "already jemalloc": Case(
        "alloc_stall", AllocEvidence("munmap", "jemalloc", 8, 20 * MS, 1 << 30), JOB,
        lambda line: "LD_PRELOAD" not in line and "MALLOC_CONF" in line,
    ),
    "tcmalloc": Case(
        "alloc_stall", AllocEvidence("free", "tcmalloc", 8, 20 * MS, 1 << 30), JOB,
        lambda line: "jemalloc" not in line and "TCMALLOC_RELEASE_RATE=0" in line,
    ),
    # Hints that change nothing on the node where the cause is not the node's.
    "file-backed major faults are not swap": Case(
        "major_fault", FaultEvidence("file", 10, 20 * MS, (3,)), JOB,
        lambda line: "swap" not in line,
    ),
    "a futex wait is the producer's": Case(
        "blocked", SyscallEvidence("sleeping", "futex", 202, 3, 20 * MS), JOB,
        lambda line: "producer" in line and "taskset" not in line,
    ),
    # Prefetching does nothing for writes; a node is named only when both are known.
    "writes from the training loop": Case(
        "io_wait", IoEvidence("259:0", "nvme0n1", 0, "write", "write", 3, 20 * MS, 1 << 20), JOB,
        lambda line: "prefetch" not in line and "checkpoint" in line and "NUMA" not in line,
    ),
    "reads from a disk on another node": Case(
        "io_wait", IoEvidence("259:0", "nvme0n1", 1, "read", "read", 3, 20 * MS, 1 << 20), JOB,
        lambda line: "prefetch_factor" in line and "nvme0n1 is on NUMA node 1" in line,
    ),
    # A full collection is scheduled, not tuned away; a young one is tuned.
    "full collections in the step": Case(
        "gc_pause", GcEvidence(2, 3, 40 * MS, 45 * MS), JOB,
        lambda line: "gc.freeze()" in line and "gc.collect(2)" in line
        and "set_threshold" not in line,
    ),
    "young collections in the step": Case(
        "gc_pause", GcEvidence(0, 40, 20 * MS, 20 * MS), JOB,
        lambda line: "gc.set_threshold" in line and "gc.collect(2)" not in line,
    ),
    # The holder is named with what it did; the fixes move its Python off the GIL.
    "GIL held by a Python thread": Case(
        "gil_wait", GilEvidence(102, "logger", 4, 20 * MS, 20 * MS, "host_work", 18 * MS), JOB,
        lambda line: "logger (tid 102)" in line and "host work" in line
        and "Py_BEGIN_ALLOW_THREADS" in line,
    ),
    "GIL holder unknown": Case(
        "gil_wait", GilEvidence(0, "", 1, 5 * MS, 5 * MS), JOB,
        lambda line: "another thread" in line and "tid" not in line,
    ),
    "host work": Case(
        "host_work", irq("softirq", 3, "NET_RX"), JOB,  # evidence unused
        lambda line: "overlap host work" in line,
    ),
    # Nothing to enable: no remedy rather than an empty list of probes.
    "unexplained with every probe running": Case(
        "unexplained", ReasonEvidence("short_offcpu", 10 * MS), JOB, lambda line: line is None,
    ),
}  # fmt: skip


def test_every_cause_with_a_remedy_is_in_the_table() -> None:
    assert {c.cause for c in CASES.values()} >= set(CAUSE_BY_NAME) - {"swap_in"}


@pytest.mark.parametrize("name", CASES)
def test_the_remedy_avoids_the_harmful_command(name: str) -> None:
    case = CASES[name]
    part = Part(case.cause, 10 * MS, (101,), (case.evidence,))
    line = CAUSE_BY_NAME[case.cause].remedy(part, case.ctx)
    assert case.check(line), line


def fake_sysctl(tmp_path: Path, value: int) -> Path:
    """A sysctl that reports `value` and logs how it was called."""
    tool = tmp_path / "bin" / "sysctl"
    tool.parent.mkdir()
    tool.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp_path}/calls\n[ "$1" = -n ] && echo {value}\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return tool.parent


def test_swappiness_already_low_is_not_raised(tmp_path: Path) -> None:
    """Run as given on a node at vm.swappiness=1: it must neither set 10 nor persist it."""
    part = Part("swap_in", 10 * MS, (101,), (FaultEvidence("swap", 10, 10 * MS, (3,)),))
    line = CAUSE_BY_NAME["swap_in"].remedy(part, JOB)
    assert line is not None
    env = {**os.environ, "PATH": f"{fake_sysctl(tmp_path, 1)}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", line], env=env, check=False)
    assert (tmp_path / "calls").read_text() == "-n vm.swappiness\n"


def test_the_job_is_every_cpu_its_threads_ran_on_in_the_stream() -> None:
    """The regression behind issue 11 item 5: the launch thread waited behind a hog on CPU 0
    while the loader (its sibling) ran on CPUs 1 and 2; the hog goes to CPU 3 only."""
    s = Stream().offcpu(100, 125, runnable=100, state="preempted", other=555, other_comm="hog")
    s.offcpu(50, 60, cpu=1, cpu_in=2, tid=102, comm="loader")
    attr = s.ran(0, 1000).ran(0, 1000, tid=102).gap(100, 140).one()
    assert attr.remedies[0] == "runq_wait: taskset -acp 3 555"
