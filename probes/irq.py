"""irq: interrupt time per CPU and per source (hard IRQs, softirqs, x86 system vectors) for
every CPU, delivered once a second as CpuStats, and the interrupt work stolen from watched
threads, delivered as IrqStolen windows (one per thread, CPU and source per window that
reached the `stolen` threshold). The kernel side (irq.bpf.c) keeps everything in maps; this
module reads them: the windows that reached the threshold (the kernel queues their keys) as
they close, per-CPU totals once a second. Nothing is streamed per interrupt, so 100k IRQs/s
reach Python as a handful of records, and a window below the threshold is never read. Hard
IRQs are named as /proc/interrupts names them (the handlers' names: "virtio1-req.0",
"nvme0q3", "mlx5_comp2@pci:...").
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import time
from array import array
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gpujitter.probes import contract, tp_cookie
from gpujitter.probes.base import BpfProbe, ProbeContext, ProbeUnavailable
from gpujitter.probes.events import CpuStats, Event, IrqStolen
from gpujitter.probes.host import HostPaths, parse_cpulist, read_text
from gpujitter.probes.interrupts import read_table
from gpujitter.probes.mapbatch import MapBatch
from gpujitter.probes.progstats import loaded_prog_stats
from gpujitter.probes.registry import TRACEFS, Hook, ProbeSpec
from gpujitter.probes.topology import Topology

KINDS = ("hardirq", "softirq", "vector")  # the .bpf.c gets them as KIND_HARDIRQ ...
HARDIRQ, SOFTIRQ, VECTOR = range(3)
OVERFLOW = 1  # IrqId.sub of the stats slot that counts hard IRQs above the array's range
IRQ_HEADROOM = 256

# Softirq vector names, as /proc/softirqs and the softirq tracepoints print them.
SOFTIRQS = (
    "HI",
    "TIMER",
    "NET_TX",
    "NET_RX",
    "BLOCK",
    "IRQ_POLL",
    "TASKLET",
    "SCHED",
    "HRTIMER",
    "RCU",
)

# x86 system vectors traced (the .bpf.c gets them as VEC_LOCAL_TIMER ...); the name is the
# tracepoint's stem.
VECTORS = (
    "local_timer",
    "reschedule",
    "call_function",
    "call_function_single",
    "irq_work",
    "x86_platform_ipi",
)

# Handlers the kernel skipped (recursion misses) are read from every program's fdinfo, ~16
# files: this often, and at close (lost counts lag by at most this much, never go uncounted).
MISSES_EVERY_NS = 10_000_000_000

# A window is read this long after it ended: a program that took its timestamp before the
# boundary has long finished writing by then.
SWEEP_GRACE_NS = 20_000_000
TOP_IRQS = 16


# What the .bpf.c gets as -D options (it never restates them).
CONSTANTS = {**contract.indexes("KIND", KINDS), **contract.indexes("VEC", VECTORS, count=False)}


@dataclass(frozen=True, slots=True)
class IrqId:
    """Which interrupt a stats slot counts: a hard IRQ's number, a softirq's vector or an
    architecture vector (kind HARDIRQ, SOFTIRQ, VECTOR; sub: OVERFLOW or the vector's index)."""

    kind: int
    sub: int
    irq: int


class IrqProbe(BpfProbe):
    bpf_file = "irq.bpf.c"
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.topology = Topology(cpu_node={})
        self.window_ns = spec.thresholds["window"]
        self.missing_vectors: list[str] = []
        self.shared_vectors = False  # one program pair for all vectors (cflags)
        self._names: dict[int, str] = {}
        self._swept_window = 0
        self._last_stats: dict[int, bytes] = {}  # stats slot -> its per-CPU values, raw
        self._possible_cpus: list[int] = []
        self.hardirq_slots = 0
        self._last_sample_ns = 0
        self._open: list[Any] = []  # keys of windows popped from `opened`, not yet closed
        self.evicted = 0  # queued windows the kernel's LRU evicted before their sweep
        self._stats: MapBatch | None = None  # the per-CPU totals' reader, made at the first sample
        self._misses, self._misses_ns = 0, 0  # recursion misses as last read, and when

    def cflags(self, ctx: ProbeContext) -> list[str]:
        present = [v for v in VECTORS if (TRACEFS / "events/irq_vectors" / f"{v}_entry").is_dir()]
        self.missing_vectors = [v for v in VECTORS if v not in present]
        # One stats slot per IRQ number up to the highest now, with room for IRQs that
        # drivers request later (a GPU's at its first use); the last slot takes the rest.
        numbered = [int(row.label) for row in read_table(HostPaths()).values() if row.numbered]
        self.hardirq_slots = (max(numbered, default=0) + IRQ_HEADROOM) // 64 * 64 + 64
        # One program pair for all vectors, told apart by the attachment's cookie, where the
        # kernel passes one (attach below); else a pair compiled per vector.
        self.shared_vectors = tp_cookie.wanted(ctx.options.get(self.name, {}))
        per_vector = [] if self.shared_vectors else ["-DGJ_PER_VECTOR"]
        return [
            *super().cflags(ctx),
            f"-DHARDIRQ_SLOTS={self.hardirq_slots}",
            *per_vector,
            *(f"-DHAVE_{v.upper()}" for v in present if per_vector),
        ]

    def attach(self, ctx: ProbeContext) -> None:
        if not self.shared_vectors:
            return
        for sub, vector in enumerate(VECTORS):
            if vector in self.missing_vectors:
                continue
            for edge in ("entry", "exit"):
                self.bpf.attach_raw_tracepoint(
                    tp=f"{vector}_{edge}", fn_name=f"vector_{edge}_any", cookie=sub
                )

    def irq_of_slot(self, slot: int) -> IrqId:
        """Which interrupt a slot of the per-CPU stats array counts (see irq.bpf.c)."""
        if slot < self.hardirq_slots - 1:
            return IrqId(HARDIRQ, 0, slot)
        if slot == self.hardirq_slots - 1:
            return IrqId(HARDIRQ, OVERFLOW, slot)
        if slot < self.hardirq_slots + 16:
            return IrqId(SOFTIRQ, 0, slot - self.hardirq_slots)
        return IrqId(VECTOR, slot - self.hardirq_slots - 16, 0)

    def start(self, ctx: ProbeContext) -> None:
        self.topology = ctx.topology
        self.window_ns = self.threshold(ctx, "window")
        if self.window_ns <= 0:
            raise ProbeUnavailable(f"irq.window must be positive, not {self.window_ns} ns")
        super().start(ctx)
        self._last_sample_ns = time.monotonic_ns()
        # Per-CPU map values come in the order of the possible CPUs.
        possible = read_text(HostPaths().sys / "devices/system/cpu/possible") or "0"
        self._possible_cpus = parse_cpulist(possible)
        self._swept_window = self._last_sample_ns // self.window_ns
        if self.missing_vectors:
            self.state = "degraded"
            self.reason = (
                f"no irq_vectors tracepoints for {', '.join(self.missing_vectors)}: "
                "time in those vectors is not seen"
            )

    def decode(self, ring: str, rec: Any) -> IrqStolen:
        """One closed window of the `stolen` map that reached the threshold: (key, value)."""
        key, win = rec
        src = IrqId(int(key.src.kind), int(key.src.sub), int(key.src.irq))
        return IrqStolen(
            ts_ns=win.first_ns,
            end_ns=win.last_ns,
            tid=key.tid,
            tgid=win.tgid,
            cpu=key.cpu,
            irq_kind=KINDS[src.kind],  # type: ignore[arg-type]
            irq=src.irq,
            name=self.name_of(src),
            count=win.count,
            total_ns=win.total_ns,
            remote=self.remote(src, key.cpu),
        )

    def poll(self) -> None:
        closed = (time.monotonic_ns() - SWEEP_GRACE_NS) // self.window_ns - 1
        if closed > self._swept_window and self.bpf is not None:
            self._sweep(closed)

    def _sweep(self, last_closed: int | None) -> None:
        """Deliver and delete every window up to index last_closed (None: all of them) that
        reached the threshold: those whose keys the kernel queued (`opened`), one lookup
        each; a window still open keeps its key here for a later sweep. A queued window the
        kernel's LRU evicted before this sweep is counted lost (`evicted`): its key is not
        found, or finds a window made since under the same key that never reached the
        threshold, or comes twice (evicted while open, made again and queued again: the map
        holds one window a key)."""
        from bcc.libbcc import lib  # only where the probe loaded: bcc is there

        table = self.bpf["stolen"]
        queue = self.bpf["opened"]
        while True:  # the keys of the windows that reached the threshold since the last sweep
            key = table.Key()
            if lib.bpf_lookup_and_delete(queue.map_fd, None, ct.byref(key)) != 0:
                break  # ENOENT: the queue is empty
            self._open.append(key)
        done: dict[bytes, list[Any]] = {}  # each closed window's key, as often as queued
        still_open: list[Any] = []
        for key in self._open:
            if last_closed is None or key.window <= last_closed:
                done.setdefault(bytes(key), []).append(key)
            else:
                still_open.append(key)
        self._open = still_open
        window = table.Leaf()
        delivered: list[Any] = []
        for key, *again in done.values():
            found = lib.bpf_lookup_elem(table.map_fd, ct.byref(key), ct.byref(window)) == 0
            if found and window.queued:
                self.deliver(self.decode("stolen", (key, window)))
                delivered.append(key)
            else:
                self.evicted += 1
            self.evicted += len(again)
        if delivered:
            delete_keys(table, delivered)
        if last_closed is not None:
            self._swept_window = last_closed

    def sample(self, now_ns: int) -> list[Event]:
        """CpuStats for each CPU that took interrupts since the previous sample."""
        if self.bpf is None:
            return []
        interval = now_ns - self._last_sample_ns
        per_cpu: dict[int, list[tuple[IrqId, int, int]]] = defaultdict(list)
        if self._stats is None:
            self._stats = MapBatch(self.bpf["stats"])
        # One copy of the whole map, cut per slot: bcc's items_lookup_batch allocated the
        # map's buffers and built a ctypes object per slot, each second.
        total, keys = self._stats.read(), self._stats.keys
        size = ct.sizeof(self._stats.table.Leaf)
        every = ct.string_at(self._stats.values, total * size)
        for n in range(total):
            slot, raw = keys[n], every[n * size : (n + 1) * size]
            previous = self._last_stats.get(slot)
            if raw == previous:
                continue  # unused, or nothing new on any CPU: no Python loop over CPUs
            self._last_stats[slot] = raw
            src = self.irq_of_slot(slot)
            now = array("Q", raw)
            old = array("Q", previous) if previous else array("Q", bytes(len(raw)))
            for i, cpu in enumerate(self._possible_cpus):
                count = now[2 * i + 1] - old[2 * i + 1]
                if count:
                    per_cpu[cpu].append((src, now[2 * i] - old[2 * i], count))
        out: list[Event] = []
        for cpu in sorted(per_cpu):
            # by time, then count: vectors that found the CPU idle are counted, not timed
            rows = sorted(per_cpu[cpu], key=lambda r: (r[1], r[2]), reverse=True)
            totals = [sum(ns for src, ns, _ in rows if src.kind == k) for k in range(3)]
            out.append(
                CpuStats(
                    ts_ns=self._last_sample_ns,
                    interval_ns=interval,
                    cpu=cpu,
                    hardirq_ns=totals[HARDIRQ],
                    softirq_ns=totals[SOFTIRQ],
                    vector_ns=totals[VECTOR],
                    top_irqs=tuple((self.name_of(s), ns, n) for s, ns, n in rows[:TOP_IRQS]),
                    remote_irqs=tuple(
                        (self.name_of(s), ns, n) for s, ns, n in rows if self.remote(s, cpu)
                    ),
                )
            )
        self._last_sample_ns = now_ns
        return out

    def name_of(self, src: IrqId) -> str:
        if src.kind == SOFTIRQ:
            return SOFTIRQS[src.irq] if src.irq < len(SOFTIRQS) else f"softirq{src.irq}"
        if src.kind == VECTOR:
            return VECTORS[src.sub] if src.sub < len(VECTORS) else f"vector{src.irq}"
        if src.sub == OVERFLOW:
            return f"irqs>={src.irq}"
        if src.irq not in self._names:
            rows = read_table(HostPaths()).values()
            self._names = {int(row.label): row.name for row in rows if row.numbered}
        return self._names.get(src.irq) or f"irq{src.irq}"

    def remote(self, src: IrqId, cpu: int) -> bool:
        """A hard IRQ whose device's node is known and is not the node of the CPU that
        handled it (topology override honoured: its [irqs] table and CPU nodes)."""
        if src.kind != HARDIRQ or src.sub == OVERFLOW:
            return False
        node = self.topology.irq_node.get(src.irq, -1)
        return node >= 0 and node != self.topology.node_of(cpu)

    def lost_kernel(self) -> int:
        """Windows lost in the kernel: those the map could not take and those whose key the
        full queue refused (counted in BPF), those the LRU evicted before their sweep
        (counted here); plus handlers whose program the kernel skipped because one of ours
        was already running on that CPU (an IRQ during a softirq's exit program)."""
        if self.bpf is None:
            return self._misses + self.evicted
        if time.monotonic_ns() - self._misses_ns >= MISSES_EVERY_NS:
            self._read_misses()
        return super().lost_kernel() + self._misses + self.evicted

    def _read_misses(self) -> None:
        self._misses_ns = time.monotonic_ns()
        self._misses = sum(s.recursion_misses for s in loaded_prog_stats(self.bpf).values())

    def close(self) -> None:
        """Stop the hooks, then hand over what the maps still hold: the open windows that
        reached the threshold and the totals since the last sample. The hooks are raw
        tracepoints: detached through the part's view (its tracepoint_fds hold none), so
        that no window reaches the threshold, or is made again, after the last sweep."""
        if self.bpf is not None and self.state in ("running", "degraded"):
            self.bpf.detach()
            self._read_misses()  # the last status counts every miss
            self._sweep(None)
            for ev in self.sample(time.monotonic_ns()):
                self._emit(ev)
        super().close()


def delete_keys(table: Any, keys: list[Any]) -> None:
    """Delete `keys` from the hash map `table` in one batch call. A key the kernel's LRU
    evicted since it was read ends a call there (ENOENT): the next call starts past it."""
    from bcc.libbcc import lib

    size = ct.sizeof(table.Key)
    batch = (table.Key * len(keys))(*keys)
    start = 0
    while start < len(keys):
        count = ct.c_uint32(len(keys) - start)
        if lib.bpf_delete_batch(table.map_fd, ct.byref(batch, start * size), ct.byref(count)) == 0:
            return
        err = ct.get_errno()
        if err != errno.ENOENT:
            raise OSError(err, os.strerror(err))
        start += count.value + 1


SPECS = (
    ProbeSpec(
        name="irq",
        summary="hard IRQ, softirq and vector time per CPU; time stolen from watched threads",
        default_on=True,
        # Attached as raw tracepoints (same hooks, no perf record built per event).
        hooks=tuple(
            Hook("tracepoint", f"{group}:{name}_{edge}", optional=group == "irq_vectors")
            for group, names in (("irq", ("irq_handler", "softirq")), ("irq_vectors", VECTORS))
            for name in names
            for edge in ("entry", "exit")
        ),
        degrades="interrupt time is not attributed (it shows as on-CPU time of the thread)",
        factory=IrqProbe,
        # stolen: windows with less stolen time are not delivered (the per-CPU totals still
        # count them); window: how long stolen time is summed before it is delivered.
        thresholds={"stolen": 100_000, "window": 100_000_000},
    ),
)
