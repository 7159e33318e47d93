"""Attributions in words, the way an operator reads them:

    GPU0 idle 38.0ms at 12:01:07.250 in pod ml/trainer-0/pytorch: 29.0ms swap-in (pid 4121
    tid 4130), 6.0ms IRQs nvme0q3 on CPU 17, 3.0ms unexplained [cuda, ±5us]

`report`, `drill`, the daemon's console output and the TUI's breakdown share these phrases, so
a cause reads the same everywhere: one line per attribution (one_line), per part (part_text)
and per item of evidence (evidence_line). Names in them (tasks, IRQs, pods) come from other
processes and are shown through gpujitter.text.printable: a line never carries a control
character.
"""

from __future__ import annotations

from typing import Any

from gpujitter.daemon.engine.causes import cause_label
from gpujitter.daemon.records import (
    AllocEvidence,
    Attribution,
    Evidence,
    FaultEvidence,
    FrameEvidence,
    GcEvidence,
    IdleEvidence,
    IoEvidence,
    IrqEvidence,
    MigrationEvidence,
    NodeEvidence,
    Part,
    ReasonEvidence,
    SyscallEvidence,
    TaskEvidence,
)
from gpujitter.probes.clock import format_wall
from gpujitter.probes.events import ClockRef
from gpujitter.text import printable
from gpujitter.units import format_bytes, format_ns


def cpus_text(cpus: tuple[int, ...]) -> str:
    if not cpus:
        return ""
    return f" on CPU {cpus[0]}" if len(cpus) == 1 else f" on CPUs {','.join(map(str, cpus))}"


def task_name(task: TaskEvidence) -> str:
    """A task that ran instead, as people look for it: comm, process and thread, and the
    pod, container or Slurm job it runs in (a hog in another tenant's pod)."""
    pid = f"pid {task.tgid} " if task.tgid and task.tgid != task.tid else ""
    where = f" in {task.workload}" if task.workload else ""
    return f"{task.comm} ({pid}tid {task.tid}){where}"


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
        who = f"behind {task_name(top)}" if top.tid else "behind an unknown task"
        if top.own:
            who = f"behind gpujitter itself (tid {top.tid}, self-inflicted)"
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
    if cause == "host_work":
        frames = _top(part, FrameEvidence)
        return f"in {frame_text(frames[0])} {_share(frames[0])}" if frames else ""
    if cause == "remote_oncpu":
        nodes = _top(part, NodeEvidence)
        gpu = f", GPU on node {attr.gpu_node}" if attr.gpu_node >= 0 else ""
        return f"node {nodes[0].node}{gpu}" if nodes else ""
    return ""


def part_text(part: Part, attr: Attribution) -> str:
    more = ", ".join(x for x in (detail(part, attr), held_by(part, attr)) if x)
    text = f"{format_ns(part.ns)} {cause_label(part.cause)}"
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


# ---------------------------------------------------------------------------------------
# Evidence, one line per item (the breakdown lists every item under its cause).


def _times(count: int, ns: int) -> str:
    return f"{count}× {format_ns(ns)}" if count else format_ns(ns)


def _notes(*notes: str) -> str:
    kept = [n for n in notes if n]
    return f" ({', '.join(kept)})" if kept else ""


def _irq_line(e: IrqEvidence, _start: int) -> str:
    number = f" {e.irq}" if e.irq_kind == "hardirq" else ""
    return f"{e.irq_kind}{number} {e.name}{cpus_text(e.cpus)}: {_times(e.count, e.ns)}" + _notes(
        f"device on node {e.device_node}" if e.device_node >= 0 else "",
        "remote to the GPU" if e.remote_to_gpu else "",
        "handled off its device's node" if e.handled_remote else "",
    )


def _task_line(e: TaskEvidence, _start: int) -> str:
    who = task_name(e) if e.tid else "an idle CPU or an unknown task"
    flag = ", after a cross-NUMA migration" if e.after_migration else ""
    return f"waited behind {who}{cpus_text(e.cpus)}: {_times(e.count, e.ns)}{flag}"


def _migration_line(e: MigrationEvidence, start: int) -> str:
    return (
        f"tid {e.tid} migrated CPU {e.src_cpu} → {e.dst_cpu} "
        f"(node {e.src_node} → {e.dst_node}) at +{format_ns(e.at_ns - start)}"
    )


def _idle_line(e: IdleEvidence, _start: int) -> str:
    latency = f" (exit latency {format_ns(e.exit_latency_ns)})" if e.exit_latency_ns >= 0 else ""
    return f"woken from {e.state_name}{cpus_text(e.cpus)}: {_times(e.count, e.ns)}{latency}"


def _syscall_line(e: SyscallEvidence, _start: int) -> str:
    call = e.syscall or (f"syscall {e.nr}" if e.nr >= 0 else "")
    return f"{e.state}{f' in {call}' if call else ''}: {_times(e.count, e.ns)}"


def _io_line(e: IoEvidence, _start: int) -> str:
    call = f" in {e.syscall}" if e.syscall else ""
    size = f", {format_bytes(e.bytes)}" if e.bytes else ""
    return f"{e.op or 'I/O'} on {e.name or e.dev}{call}: {_times(e.count, e.ns)}{size}" + _notes(
        f"device on node {e.node}" if e.node >= 0 else "",
        "remote to the GPU" if e.remote_to_gpu else "",
    )


def _fault_line(e: FaultEvidence, _start: int) -> str:
    first = f", first at {e.addresses[0]:#x}" if e.addresses else ""
    return f"{e.kind} faults{cpus_text(e.cpus)}: {e.count}× {format_ns(e.ns)}{first}"


def _alloc_line(e: AllocEvidence, _start: int) -> str:
    who = f" ({e.allocator})" if e.allocator else ""
    size = f", {format_bytes(e.bytes)}" if e.bytes else ""
    return f"{e.call}{who}: {_times(e.count, e.ns)}{size}"


def _gc_line(e: GcEvidence, _start: int) -> str:
    which = f"generation {e.generation}" if e.generation >= 0 else "generation unknown"
    freed = f", {e.collected} objects freed" if e.collected >= 0 else ""
    return f"GC {which}: {_times(e.count, e.ns)}, {format_ns(e.dur_ns)} in all{freed}"


def frame_text(e: FrameEvidence) -> str:
    """A sampled Python function as people look for it: name (file:line)."""
    return f"{e.func} ({e.file}:{e.line})" if e.func else "no Python frame"


def _share(e: FrameEvidence) -> str:
    return f"{100 * e.samples // max(1, e.of)}% of {e.of} sample{'s' if e.of != 1 else ''}"


def _frame_line(e: FrameEvidence, _start: int) -> str:
    return f"Python {frame_text(e)}: {_share(e)}, ~{format_ns(e.ns)}"


def _node_line(e: NodeEvidence, _start: int) -> str:
    where = "remote" if e.remote else "local"
    return f"on-CPU on node {e.node} ({where}){cpus_text(e.cpus)}: {format_ns(e.ns)}"


REASONS = {
    "no_thread": "no feeding thread known",
    "no_data": "no probe data for the span",
    "short_offcpu": "off-CPU spans below the probe's threshold",
    "evicted": "data evicted before the gap was attributed",
}


def _reason_line(e: ReasonEvidence, _start: int) -> str:
    return f"{REASONS.get(e.reason, e.reason)}: {format_ns(e.ns)}"


_LINES: dict[type, Any] = {
    IrqEvidence: _irq_line,
    TaskEvidence: _task_line,
    MigrationEvidence: _migration_line,
    IdleEvidence: _idle_line,
    SyscallEvidence: _syscall_line,
    IoEvidence: _io_line,
    FaultEvidence: _fault_line,
    AllocEvidence: _alloc_line,
    GcEvidence: _gc_line,
    FrameEvidence: _frame_line,
    NodeEvidence: _node_line,
    ReasonEvidence: _reason_line,
}


def evidence_line(e: Evidence, gap_start_ns: int) -> str:
    """One item of evidence in words (a migration's time relative to the gap's start)."""
    return printable(_LINES[type(e)](e, gap_start_ns))
