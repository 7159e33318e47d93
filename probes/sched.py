"""sched: off-CPU intervals of watched threads (the state they left in, the syscall they
blocked in, who woke them, and, for an uninterruptible wait that a block request's
completion ended, that request's device, size and direction: an I/O wait), run-queue waits
with the task that ran instead (CPU contention), migrations with their NUMA nodes, and
on-CPU time per node. Traced through sched_switch, sched_waking, sched_migrate_task,
block_rq_complete and block_io_done (see sched.bpf.c for the in-kernel side and its cost);
intervals above the `offcpu` or `runq` threshold, and I/O waits above `io`, are streamed as
OffCpu, cross-node migrations as Migration, and once a second every watched thread's totals
arrive as ThreadSched and NodeTime, the histograms as Log2Hist.
"""

from __future__ import annotations

import ctypes as ct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpujitter.probes import contract
from gpujitter.probes.base import BpfProbe, ProbeContext, ProbeUnavailable, comm_str
from gpujitter.probes.btf import BtfError, offset_cflags
from gpujitter.probes.events import Event, Migration, NodeTime, OffCpu, ThreadSched, WorkloadInfo
from gpujitter.probes.host import HostPaths
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.registry import Hook, ProbeSpec, tracepoint_exists
from gpujitter.probes.workload import TaskOwners

# OffCpu.state by index; the .bpf.c gets them as ST_PREEMPTED .. ST_OTHER, ST_COUNT.
STATES = ("preempted", "sleeping", "uninterruptible", "stopped", "other")
CONSTANTS = contract.indexes("ST", STATES)  # what the .bpf.c gets as -D options
IO_OPS = ("", "read", "write", "other")  # IO_* in the .bpf.c
BLOCK_COMPLETE = "block:block_rq_complete"
BLOCK_DONE = "block:block_io_done"
MINOR_BITS = 20  # the kernel's dev_t: major << 20 | minor (block tracepoints' dev field)


def dev_name(dev: int) -> str:
    """A kernel dev_t as MAJ:MIN, the form of /sys/dev/block and /sys/class/block/*/dev."""
    return f"{dev >> MINOR_BITS}:{dev & ((1 << MINOR_BITS) - 1)}" if dev else ""


@dataclass(slots=True)
class _Totals:
    """One thread's cumulative counters as last reported."""

    tgid: int
    offcpu_ns: int = 0
    runq_ns: int = 0
    switches: int = 0
    preemptions: int = 0
    migrations: int = 0
    cross_node: int = 0
    oncpu_ns: tuple[int, ...] = ()


class SchedProbe(BpfProbe):
    bpf_file = "sched.bpf.c"
    rings = ("offcpu_events", "migrations")
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.syscall_from_regs = True
        self.raw_flags: list[str] = []  # raw tracepoints, with task_struct offsets from BTF
        self.slower = ""  # why not: the perf tracepoints instead
        self.nodes = 1
        self._last: dict[int, _Totals] = {}
        self._last_ns = 0
        self._cpu_node: dict[int, int] = {}
        self._hists: list[Log2Map] = []
        self._owners = TaskOwners(HostPaths())

    def cflags(self, ctx: ProbeContext) -> list[str]:
        self._cpu_node = dict(ctx.topology.cpu_node)
        self.nodes = max(self._cpu_node.values(), default=0) + 1
        try:
            fields = ("pid", "comm", "se.sum_exec_runtime")
            self.raw_flags = ["-DSCHED_RAW", *offset_cflags("TASK", "task_struct", fields)]
            self.slower = ""
        except BtfError as err:
            self.raw_flags = []
            self.slower = f"perf tracepoints, about twice the cost per switch ({err})"
        flags = [*super().cflags(ctx), f"-DSCHED_NODES={self.nodes}"]
        if self.syscall_from_regs:
            flags.append("-DSCHED_SYSCALL_FROM_REGS")
        if tracepoint_exists(BLOCK_COMPLETE):
            flags.append("-DSCHED_IO_WAKE")
        if tracepoint_exists(BLOCK_DONE):
            flags.append("-DSCHED_IO_DONE")
        return flags + self.raw_flags

    def start(self, ctx: ProbeContext) -> None:
        try:
            super().start(ctx)
        except ProbeUnavailable as err:
            # Reading the registers of the current task needs BTF-typed helpers; without
            # them everything but the blocked-in syscall still works.
            self.syscall_from_regs = False
            super().start(ctx)
            self.state = "degraded"
            self.reason = f"syscall of blocked threads not reported (-1): {err}"
        if not tracepoint_exists(BLOCK_COMPLETE):
            self.state = "degraded"
            why = f"no {BLOCK_COMPLETE}: I/O waits are not told from other uninterruptible waits"
            self.reason = "; ".join(r for r in (self.reason, why) if r)
        if self.slower:
            self.state = "degraded"
            self.reason = "; ".join(r for r in (self.reason, self.slower) if r)
        self._last_ns = time.monotonic_ns()
        self._hists = [
            Log2Map(self.bpf["offcpu_log2"], [f"offcpu.{s}" for s in STATES], self.name),
            Log2Map(self.bpf["runq_log2"], ["runq"], self.name),
        ]

    def decode(self, ring: str, rec: Any) -> Event:
        if ring == "migrations":
            return Migration(
                ts_ns=rec.ts_ns,
                tid=rec.tid,
                tgid=rec.tgid,
                src_cpu=rec.src_cpu,
                dst_cpu=rec.dst_cpu,
                src_node=rec.src_node,
                dst_node=rec.dst_node,
                comm=comm_str(rec.comm),
            )
        # The task that ran instead is named with its process, and that process's workload
        # once (a hog in another pod), ahead of the record that names it.
        other_tgid = self._owners.tgid_of(rec.other_tid)
        workload = self._owners.first_seen(other_tgid)
        if workload is not None:
            self.deliver(WorkloadInfo(ts_ns=rec.ts_ns, tgid=other_tgid, workload=workload))
        return OffCpu(
            ts_ns=rec.ts_ns,
            end_ns=rec.end_ns,
            tid=rec.tid,
            tgid=rec.tgid,
            cpu=rec.cpu,
            cpu_in=rec.cpu_in,
            state=STATES[rec.state],  # type: ignore[arg-type]
            runnable_ns=rec.runnable_ns,
            waker_tid=rec.waker_tid,
            syscall=rec.syscall,
            other_tid=rec.other_tid,
            other_comm=comm_str(rec.other_comm),
            other_tgid=other_tgid,
            other_ns=rec.other_ns,
            comm=comm_str(rec.comm),
            io_dev=dev_name(rec.io_dev),
            io_bytes=rec.io_bytes,
            io_op=IO_OPS[rec.io_op] if rec.io_dev else "",
        )

    def sample(self, now_ns: int) -> Iterable[Event]:
        interval = now_ns - self._last_ns
        events = list(self._thread_totals(now_ns, interval))
        for hists in self._hists:
            events += hists.delta(now_ns, interval)
        self._last_ns = now_ns
        return events

    def _running(self, now_ns: int) -> dict[int, list[int]]:
        """On-CPU time of watched threads still running, not yet added by a switch-out:
        tid -> ns per node."""
        out: dict[int, list[int]] = {}
        for cpu, run in enumerate(self.bpf["running"][ct.c_uint(0)]):
            if run.tid and now_ns > run.since_ns:
                per_node = out.setdefault(run.tid, [0] * self.nodes)
                per_node[self._cpu_node.get(cpu, 0)] += now_ns - run.since_ns
        return out

    def _thread_totals(self, now_ns: int, interval: int) -> Iterator[Event]:
        table = self.bpf["threads"]
        running = self._running(now_ns)
        exited = []
        for tid, st in table.items_lookup_batch():
            oncpu = list(st.oncpu_ns)
            for node, ns in enumerate(running.get(tid, ())):
                oncpu[node] += ns
            last = self._last.get(tid)
            if last is None or last.tgid != st.tgid or st.switches < last.switches:
                # new, or its id was reused by another thread and the kernel started over
                last = _Totals(tgid=st.tgid, oncpu_ns=(0,) * self.nodes)
            # In-progress on-CPU time read a moment ago may exceed what the kernel adds at
            # the switch-out (the two maps are read apart): never report time backwards.
            now = _Totals(
                tgid=st.tgid,
                offcpu_ns=st.offcpu_ns,
                runq_ns=st.runq_ns,
                switches=st.switches,
                preemptions=st.preemptions,
                migrations=st.migrations,
                cross_node=st.cross_node,
                oncpu_ns=tuple(max(a, b) for a, b in zip(oncpu, last.oncpu_ns, strict=True)),
            )
            self._last[tid] = now
            if st.exited:
                exited.append(tid)
            node_ns = tuple(
                (node, a - b)
                for node, (a, b) in enumerate(zip(now.oncpu_ns, last.oncpu_ns, strict=True))
                if a > b
            )
            if now.switches != last.switches or node_ns or now.migrations != last.migrations:
                yield ThreadSched(
                    ts_ns=now_ns - interval,
                    interval_ns=interval,
                    tid=tid,
                    tgid=st.tgid,
                    oncpu_ns=sum(ns for _, ns in node_ns),
                    offcpu_ns=now.offcpu_ns - last.offcpu_ns,
                    runq_ns=now.runq_ns - last.runq_ns,
                    switches=now.switches - last.switches,
                    preemptions=now.preemptions - last.preemptions,
                    migrations=now.migrations - last.migrations,
                    cross_node_migrations=now.cross_node - last.cross_node,
                )
            if node_ns:
                yield NodeTime(
                    ts_ns=now_ns - interval,
                    interval_ns=interval,
                    tid=tid,
                    tgid=st.tgid,
                    node_ns=node_ns,
                )
        for tid in exited:
            del table[ct.c_uint(tid)]
            self._last.pop(tid, None)


SPECS = (
    ProbeSpec(
        name="sched",
        summary="off-CPU intervals, run-queue waits (CPU contention), migrations, NUMA time",
        default_on=True,
        hooks=(
            Hook("tracepoint", "sched:sched_switch"),
            Hook("tracepoint", "sched:sched_waking"),
            Hook("tracepoint", "sched:sched_migrate_task"),
            Hook("tracepoint", BLOCK_COMPLETE, optional=True),
            Hook("tracepoint", BLOCK_DONE, optional=True),
        ),
        degrades="off-CPU, run-queue (contention) and cross-NUMA time are not attributed",
        factory=SchedProbe,
        # io: I/O waits are streamed from this length, below offcpu: read-ahead windows on a
        # fast disk are waits of a few ms, each too short for offcpu yet many in a gap.
        thresholds={"offcpu": 5_000_000, "runq": 1_000_000, "io": 1_000_000},
    ),
)
