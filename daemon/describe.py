"""Attributions in words, the way an operator reads them:

    GPU0 idle 38.0ms at 12:01:07.250 in pod ml/trainer-0/pytorch: 29.0ms swap-in (pid 4121
    tid 4130), 6.0ms IRQs nvme0q3 on CPU 17, 3.0ms unexplained [cuda, ±5us]

`report`, `drill` and the daemon's console output share these phrases, so a cause reads the
same everywhere. Names in them (tasks, IRQs, pods) come from other processes and are shown through
gpujitter.text.printable: a line never carries a control character.
"""

from __future__ import annotations

from typing import Any

from gpujitter.daemon.records import (
    AllocEvidence,
    Attribution,
    FaultEvidence,
    GcEvidence,
    IdleEvidence,
    IoEvidence,
    IrqEvidence,
    NodeEvidence,
    Part,
    SyscallEvidence,
    TaskEvidence,
)
from gpujitter.probes.clock import format_wall
from gpujitter.probes.events import ClockRef
from gpujitter.text import printable
from gpujitter.units import format_bytes, format_ns

CAUSE_LABELS = {
    "swap_in": "swap-in",
    "major_fault": "major faults (file)",
    "idle_wake": "wake-up from idle",
    "irq": "IRQs",
    "minor_faults": "minor faults",
    "runq_wait": "run-queue wait",
    "alloc_stall": "allocator stall",
    "io_wait": "I/O wait",
    "blocked": "blocked",
    "gc_pause": "Python GC pause",
    "remote_oncpu": "on-CPU on a remote node",
    "host_work": "host work",
    "unexplained": "unexplained",
}


def cpus_text(cpus: tuple[int, ...]) -> str:
    if not cpus:
        return ""
    return f" on CPU {cpus[0]}" if len(cpus) == 1 else f" on CPUs {','.join(map(str, cpus))}"


def _top(part: Part, cls: type[Any]) -> list[Any]:
    return sorted((e for e in part.evidence if isinstance(e, cls)), key=lambda e: -e.ns)


def held_by(part: Part, attr: Attribution) -> str:
    """Where a part's time lay when a wait was followed into the thread that ended it: the
    waker holding most of it, named with its process and its hops from the critical thread
    ("" when none does). Its time comes first when it holds only some of the part."""
    holders = [
        (c.ns, -r.tid, r)
        for r in attr.threads
        if r.role == "waker"
        for c in r.causes
        if c.cause == part.cause
    ]
    if not holders:
        return ""
    ns, _, r = max(holders, key=lambda h: h[:2])
    share = f"{format_ns(ns)} " if ns < part.ns else ""
    hops = f"{r.hops} hop{'s' if r.hops != 1 else ''}"
    where = f" ({r.workload})" if r.workload and r.workload != attr.workload else ""
    return f"{share}in {r.comm or '?'} pid {r.tgid} tid {r.tid}{where}, {hops}"


def detail(part: Part, attr: Attribution) -> str:
    """What a part's evidence names: which IRQ, which task, which state, which call."""
    cause = part.cause
    if cause in ("swap_in", "major_fault", "minor_faults"):
        faults = _top(part, FaultEvidence)
        count = sum(f.count for f in faults)
        tids = ",".join(map(str, part.tids))
        # A waker's faults are named by held_by, with the waker's own process.
        who = f"pid {attr.tgid} tid {tids}" if part.tids and not held_by(part, attr) else ""
        what = f"{count} fault{'s' if count != 1 else ''}" if count else ""
        return ", ".join(x for x in (who, what) if x)
    if cause == "irq":
        irqs = _top(part, IrqEvidence)
        if not irqs:
            return ""
        top = irqs[0]
        remote = " (remote to GPU)" if top.remote_to_gpu else ""
        more = f" +{len(irqs) - 1} more" if len(irqs) > 1 else ""
        return f"{top.name}{cpus_text(top.cpus)}{remote}{more}"
    if cause == "runq_wait":
        tasks = _top(part, TaskEvidence)
        if not tasks:
            return ""
        top = tasks[0]
        who = f"behind {top.comm} (tid {top.tid})" if top.tid else "behind an unknown task"
        flag = ", after a cross-NUMA migration" if any(t.after_migration for t in tasks) else ""
        return f"{who}{cpus_text(top.cpus)}{flag}"
    if cause == "idle_wake":
        states = _top(part, IdleEvidence)
        return f"from {states[0].state_name}{cpus_text(states[0].cpus)}" if states else ""
    if cause == "io_wait":
        disks = _top(part, IoEvidence)
        if not disks:
            return ""
        top = disks[0]
        node = f" (node {top.node})" if top.node >= 0 else ""
        call = f" in {top.syscall}" if top.syscall else ""
        count = sum(d.count for d in disks)
        return f"{top.op or 'I/O'} on {top.name or top.dev}{node}{call} x{count}"
    if cause == "blocked":
        calls = _top(part, SyscallEvidence)
        return f"in {calls[0].syscall}" if calls and calls[0].syscall else ""
    if cause == "alloc_stall":
        calls = _top(part, AllocEvidence)
        if not calls:
            return ""
        size = f" {format_bytes(calls[0].bytes)}" if calls[0].bytes else ""
        return f"{calls[0].call}{size} x{sum(c.count for c in calls)}"
    if cause == "gc_pause":
        gens = _top(part, GcEvidence)
        if not gens:
            return ""
        top = gens[0]
        gen = f"gen {top.generation}" if top.generation >= 0 else "generation unknown"
        count = sum(g.count for g in gens)
        return f"{gen}, {count} collection{'s' if count != 1 else ''} of {format_ns(top.dur_ns)}"
    if cause == "remote_oncpu":
        nodes = _top(part, NodeEvidence)
        gpu = f", GPU on node {attr.gpu_node}" if attr.gpu_node >= 0 else ""
        return f"node {nodes[0].node}{gpu}" if nodes else ""
    return ""


def part_text(part: Part, attr: Attribution) -> str:
    more = ", ".join(x for x in (detail(part, attr), held_by(part, attr)) if x)
    text = f"{format_ns(part.ns)} {CAUSE_LABELS.get(part.cause, part.cause)}"
    return printable(text + (f" ({more})" if more else ""))


def gpu_name(index: int) -> str:
    """GPU0, or GPU? for gaps on no known GPU (no NVML: the feeder's GPU is not known)."""
    return f"GPU{index}" if index >= 0 else "GPU?"


def one_line(attr: Attribution, clock: ClockRef | None = None) -> str:
    when = format_wall(clock, attr.ts_ns)[:-3] if clock else f"t={attr.ts_ns}ns"
    parts = ", ".join(part_text(p, attr) for p in attr.parts)
    sources = "+".join(attr.sources)
    where = f" in {attr.workload}" if attr.workload else ""
    return printable(
        f"{gpu_name(attr.gpu)} idle {format_ns(attr.dur_ns)} at {when}{where}: {parts} "
        f"[{sources}, ±{format_ns(attr.resolution_ns)}]"
    )
