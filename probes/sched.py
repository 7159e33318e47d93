"""sched: off-CPU intervals of watched threads (the state they left in, the syscall they
blocked in, who woke them, and, for an uninterruptible wait that a block request's
completion ended, that request's device, size and direction: an I/O wait), run-queue waits
with the task that ran instead (CPU contention), migrations with their NUMA nodes, and
on-CPU time per node. Traced through sched_switch, sched_waking, sched_migrate_task,
block_rq_complete and block_io_done (see sched.bpf.c for the in-kernel side and its cost);
intervals above the `offcpu` or `runq` threshold, and I/O waits above `io`, are streamed as
OffCpu, cross-node migrations as Migration, and once a second every watched thread's totals
arrive as ThreadSched and NodeTime, the histograms as Log2Hist; an interval still open at
that read, past the `offcpu` threshold, is announced once as OffCpuOpen.
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
from gpujitter.probes.events import (
    Event,
    Migration,
    NodeTime,
    OffCpu,
    OffCpuOpen,
    ThreadSched,
    WorkloadInfo,
)
from gpujitter.probes.host import HostPaths
from gpujitter.probes.ledger import Ledger
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.mapbatch import MapBatch
from gpujitter.probes.registry import Hook, ProbeSpec, tracepoint_exists
from gpujitter.probes.workload import TaskOwners

# OffCpu.state by index; the .bpf.c gets them as ST_PREEMPTED .. ST_OTHER, ST_COUNT.
STATES = ("preempted", "sleeping", "uninterruptible", "stopped", "other")
CONSTANTS = contract.indexes("ST", STATES)  # what the .bpf.c gets as -D options
IO_OPS = ("", "read", "write", "other")  # IO_* in the .bpf.c
BLOCK_COMPLETE = "block:block_rq_complete"
BLOCK_DONE = "block:block_io_done"
MINOR_BITS = 20  # the kernel's dev_t: major << 20 | minor (block tracepoints' dev field)
THREADS_PER_READ = 1024  # `threads` entries per batch lookup (the map holds GJ_MAX_THREADS)
# The shared slot (ProbeContext.shared) where cstate, carried by this probe, takes the
# IdleWake an off-CPU record carries.
IDLE_WAKE_CARRIED = "cstate.idle_wake"


def dev_name(dev: int) -> str:
    """A kernel dev_t as MAJ:MIN, the form of /sys/dev/block and /sys/class/block/*/dev."""
    return f"{dev >> MINOR_BITS}:{dev & ((1 << MINOR_BITS) - 1)}" if dev else ""


def oncpu_at(
    charged: dict[int, list[int]],
    before: dict[int, tuple[int, int]],
    after: dict[int, tuple[int, int]],
    at_ns: int,
    cpu_node: dict[int, int],
) -> dict[int, list[int]]:
    """Per thread, its on-CPU ns per node at at_ns: what its switch-outs charged (`charged`,
    from one copy of `threads`) and its stint in progress up to at_ns, where the CPU's
    `running` slot (cpu -> (tid, since_ns)) is the same in the copies taken right before and
    after (`before`, `after`; at_ns stamped before all three): no switch there between them,
    so the charged copy holds none of that stint. A slot that changed saw the stint end (or a
    new one begin) meanwhile, and the copy may have charged it already: it is left to the
    next read rather than counted twice. Never more than the thread ran by the copy."""
    out = {tid: list(ns) for tid, ns in charged.items()}
    for cpu, (tid, since_ns) in before.items():
        row = out.get(tid)
        if row is not None and after.get(cpu) == (tid, since_ns) and at_ns > since_ns:
            row[cpu_node.get(cpu, 0)] += at_ns - since_ns
    return out


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
        self._oncpu = Ledger({}, 0)  # per thread, on-CPU ns per node handed out
        self._cpu_node: dict[int, int] = {}
        self._hists: list[Log2Map] = []
        self._threads: MapBatch | None = None
        self._owners = TaskOwners(HostPaths())
        self._shared: dict[str, Any] = {}
        self._open_after = 0  # the offcpu threshold: OffCpuOpen from there, as OffCpu

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
        self._shared = ctx.shared
        self._open_after = self.threshold(ctx, "offcpu")
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
        now = time.monotonic_ns()
        self._oncpu = Ledger({}, now)
        self._hists = [
            Log2Map(self.bpf["offcpu_log2"], [f"offcpu.{s}" for s in STATES], self.name, now),
            Log2Map(self.bpf["runq_log2"], ["runq"], self.name, now),
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
        if rec.idle_state:
            # cstate's IdleWake of this switch-in, carried in the record (sched.bpf.c): handed
            # to cstate, which delivers it as its own, ahead of the interval as the kernel
            # made them; gone with cstate if it stopped meanwhile.
            carried = self._shared.get(IDLE_WAKE_CARRIED)
            if carried is not None:
                carried(rec)
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
        return list(self._thread_totals())

    def log2_maps(self) -> list[Log2Map]:
        return self._hists

    def _slots(self) -> dict[int, tuple[int, int]]:
        """CPU -> (tid, since_ns) of the watched thread on it, from one copy of `running`."""
        return {
            cpu: (run.tid, run.since_ns)
            for cpu, run in enumerate(self.bpf["running"][ct.c_uint(0)])
            if run.tid
        }

    def _read(self) -> tuple[list[tuple[int, Any]], dict[int, list[int]], int]:
        """`threads` and every thread's on-CPU ns per node at the read's stamp (oncpu_at)."""
        read_ns = time.monotonic_ns()
        before = self._slots()
        if self._threads is None:  # buffers for a thousand threads, not the map's 65536
            self._threads = MapBatch(self.bpf["threads"], entries=THREADS_PER_READ)
        rows = list(self._threads.items())
        after = self._slots()
        charged = {tid: list(st.oncpu_ns) for tid, st in rows}
        return rows, oncpu_at(charged, before, after, read_ns, self._cpu_node), read_ns

    def _thread_totals(self) -> Iterator[Event]:
        # Samples run from read to read, not from tick to tick: the maps are read after the
        # core's refresh and other probes' samples, and what ran meanwhile is the next one's.
        since_ns = self._oncpu.since_ns
        rows, oncpu, read_ns = self._read()
        interval = read_ns - since_ns
        lasts = {}
        for tid, st in rows:
            last = self._last.get(tid)
            if last is None or last.tgid != st.tgid or st.switches < last.switches:
                # new, or its id was reused by another thread and the kernel started over
                last = _Totals(tgid=st.tgid)
                self._oncpu.forget(tid)
            lasts[tid] = last
        gains = self._oncpu.take(oncpu, read_ns)
        exited = []
        for tid, st in rows:
            last = lasts[tid]
            now = _Totals(
                tgid=st.tgid,
                offcpu_ns=st.offcpu_ns,
                runq_ns=st.runq_ns,
                switches=st.switches,
                preemptions=st.preemptions,
                migrations=st.migrations,
                cross_node=st.cross_node,
            )
            self._last[tid] = now
            if st.exited and not self._oncpu.owed(tid):
                exited.append(tid)  # once all its on-CPU time is out
            node_ns = tuple(gains[tid])
            if now.switches != last.switches or node_ns or now.migrations != last.migrations:
                yield ThreadSched(
                    ts_ns=since_ns,
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
                    ts_ns=since_ns, interval_ns=interval, tid=tid, tgid=st.tgid, node_ns=node_ns
                )
            # Off CPU across this read, and first past the threshold since the last one (so
            # once an interval): the engine would otherwise take the thread for one that may
            # be running until its OffCpu comes, at the wake-up.
            off_for = read_ns - st.off_ns
            if st.off_ns and not st.exited and off_for >= self._open_after > off_for - interval:
                yield OffCpuOpen(
                    ts_ns=st.off_ns,
                    as_of_ns=read_ns,
                    tid=tid,
                    tgid=st.tgid,
                    state=STATES[st.state],  # type: ignore[arg-type]
                    syscall=st.syscall,
                )
        for tid in exited:
            del self.bpf["threads"][ct.c_uint(tid)]
            self._last.pop(tid, None)
            self._oncpu.forget(tid)


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
