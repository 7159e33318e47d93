"""faults and swap: page faults of watched threads, counted and timed (entry to completion)
in the kernel by faults.bpf.c, which both probes share.

faults streams minor faults summed per thread into short windows (MinorFaults, once a
window's fault time reaches the `minor` threshold) and file-backed major faults one by one
above `major` (MajorFault kind "file"); swap streams swap-ins above `swapin` (MajorFault kind
"swap"; faults streams them itself when swap is not running). Per-thread counts and times of
every class come once a second (FaultStats). Cost: one raw-tracepoint program per page fault
of the node (a filter for unwatched threads), one perf-event program per major fault; see
docs/performance.md.
"""

from __future__ import annotations

import ctypes as ct
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from gpujitter.probes import contract
from gpujitter.probes.base import (
    Probe,
    ProbeContext,
    ProbeUnavailable,
    SliceCheck,
    comm_str,
    threshold_cflags,
)
from gpujitter.probes.btf import BtfError, offset_cflags
from gpujitter.probes.bundle import ModulePart, load_part
from gpujitter.probes.events import Event, FaultStats, MajorFault, MinorFaults
from gpujitter.probes.progstats import program_fds
from gpujitter.probes.registry import Hook, ProbeSpec, tracepoint_exists

FAULT_CLASSES = ("minor", "file", "swap", "unclassified")  # index = CLS_* in faults.bpf.c
CLS_MINOR, CLS_FILE, CLS_SWAP, CLS_UNCLASSIFIED = range(len(FAULT_CLASSES))
STREAM_MINOR, STREAM_FILE, STREAM_SWAP = 1, 2, 4  # stream_modes bits
# Faults between a storm's clock reads: a stretch of this many is timed whole or not at all
# (the fault-storm drill measures its truth by the same stretches).
STORM_READ_EVERY = 16
# What faults.bpf.c gets as -D options: CLS_MINOR .. CLS_COUNT, the stream_modes bits and
# the stretch of a storm.
CONSTANTS = {
    **contract.indexes("CLS", FAULT_CLASSES),
    "STREAM_MINOR": STREAM_MINOR,
    "STREAM_FILE": STREAM_FILE,
    "STREAM_SWAP": STREAM_SWAP,
    "STORM_READ_EVERY": STORM_READ_EVERY,
}

# Every fault's entry (x86 exception tracepoints, raw: bcc attaches them itself).
ENTRY_HOOKS = ("exceptions:page_fault_user", "exceptions:page_fault_kernel")
# perf software event configs (PERF_COUNT_SW_*) and the program each one runs.
PERF_HOOKS = (("major-faults", 6, "on_major_done"),)
FILEMAP_FAULT = "filemap:mm_filemap_fault"
BIO_QUEUE = "block:block_bio_queue"


class FaultPrograms:
    """faults.bpf.c, loaded once per probe set for whichever of faults and swap run: it
    streams what its members want and hands each record to the probe that owns it."""

    KEY = "faults.bpf.c"  # in ProbeContext.shared

    def __init__(self) -> None:
        self.bpf: Any = None
        self.members: dict[str, FaultProbe] = {}
        self.failure = ""
        self.caveat = ""  # what the loaded object cannot do on this kernel
        self.have_filemap = tracepoint_exists(FILEMAP_FAULT)
        self.have_bio = tracepoint_exists(BIO_QUEUE)
        self._previous: dict[int, tuple[int, ...]] = {}
        self._sampled_ns = 0
        # faults and swap close side by side (ProbeSet.close): without it both could find
        # the other gone and unload the object twice, closing its descriptors twice.
        self._members_lock = threading.Lock()

    @classmethod
    def of(cls, ctx: ProbeContext) -> FaultPrograms:
        programs = ctx.shared.get(cls.KEY)
        if programs is None:
            programs = ctx.shared[cls.KEY] = cls()
        return programs

    def join(self, probe: FaultProbe, ctx: ProbeContext) -> None:
        if self.bpf is None:
            if self.failure:
                raise ProbeUnavailable(self.failure)
            try:
                self._load(ctx)
            except ProbeUnavailable as err:
                self.failure = str(err)
                raise
        self.members[probe.name] = probe
        self._set_modes()

    def leave(self, probe: FaultProbe) -> None:
        with self._members_lock:
            if self.members.pop(probe.name, None) is None:
                return
            if self.members:
                self._set_modes()
            else:
                self.bpf.cleanup()
                self.bpf = None

    def part(self, ctx: ProbeContext) -> ModulePart:
        """faults.bpf.c with its options, as a part of the set's module."""
        cflags = [flag for spec in SPECS for flag in threshold_cflags(spec, ctx)]
        cflags += contract.cflags(CONSTANTS)
        try:
            fields = ("nvcsw", "nivcsw")
            cflags += ["-DFAULTS_SWITCHES", *offset_cflags("TASK", "task_struct", fields)]
        except BtfError as err:
            self.caveat = f"a storm interrupted by a switch counts the time off CPU ({err})"
        if self.have_filemap:
            cflags.append("-DHAVE_FILEMAP_FAULT")
            if self.have_bio:
                cflags.append("-DCLASSIFY_SWAP")
        return ModulePart("faults", Path(__file__).with_name("faults.bpf.c"), tuple(cflags))

    def _load(self, ctx: ProbeContext) -> None:
        from bcc import PerfType

        def attach(bpf: Any) -> None:
            for _, config, fn in PERF_HOOKS:
                bpf.attach_perf_event(
                    ev_type=PerfType.SOFTWARE, ev_config=config, fn_name=fn, sample_period=1
                )

        self.bpf = load_part(ctx, self.part(ctx), attach)
        self._ring = self.bpf["fault_records"]
        self._drained = SliceCheck()
        self._ring.open_ring_buffer(self._on_record)
        self._sampled_ns = time.monotonic_ns()

    def _set_modes(self) -> None:
        modes = STREAM_SWAP
        if "faults" in self.members:
            modes |= STREAM_MINOR | STREAM_FILE
        self.bpf["stream_modes"][ct.c_int(0)] = ct.c_uint(modes)

    def owner(self, cls: int) -> FaultProbe | None:
        """The probe a record of class `cls` belongs to: swap-ins to swap when it runs."""
        if cls == CLS_SWAP and "swap" in self.members:
            return self.members["swap"]
        return self.members.get("faults")

    def _on_record(self, _ctx: Any, data: int, _size: int) -> int:
        rec = self._ring.event(data)
        probe = self.owner(rec.cls)
        if probe is not None:
            probe.deliver(decode(rec))
        return self._drained()

    def poll(self) -> None:
        self.bpf.ring_buffer_consume()

    def ring_fds(self) -> list[int]:
        return [self._ring.map_fd]

    def lost(self, probe: FaultProbe) -> int:
        table = self.bpf["lost_by_class"]
        return sum(
            int(table.sum(ct.c_int(cls)).value)
            for cls in range(len(FAULT_CLASSES))
            if self.owner(cls) is probe
        )

    def sample(self, probe: FaultProbe, now_ns: int) -> list[FaultStats]:
        """Per-thread counter deltas since the last sample, once per probe set (through the
        first member); entries of threads that have exited are dropped after their last
        delta went out."""
        if probe is not next(iter(self.members.values())):
            return []
        interval_ns, self._sampled_ns = now_ns - self._sampled_ns, now_ns
        table = self.bpf["threads"]
        stats, live = [], set()
        for key, t in table.items():
            tid = key.value
            counters = (*t.count, *t.total_ns, t.untimed)
            before = self._previous.get(tid, (0,) * len(counters))
            if any(c < b for c, b in zip(counters, before, strict=True)):
                before = (0,) * len(counters)  # a new entry under a reused thread id
            delta = [c - b for c, b in zip(counters, before, strict=True)]
            if any(delta):
                stats.append(thread_stats(now_ns, interval_ns, tid, t.tgid, delta))
            elif not os.path.exists(f"/proc/{t.tgid}/task/{tid}"):
                del table[key]
                continue
            self._previous[tid] = counters
            live.add(tid)
        self._previous = {tid: c for tid, c in self._previous.items() if tid in live}
        return stats

    def histograms(self) -> dict[str, list[int]]:
        """Fault time per class as log2 histograms: counts[i] faults took [2^i, 2^(i+1)) ns."""
        table = self.bpf["fault_ns_log2"]
        return {
            name: [int(table.sum(ct.c_int(cls * 64 + i)).value) for i in range(64)]
            for cls, name in enumerate(FAULT_CLASSES)
        }


def thread_stats(
    now_ns: int, interval_ns: int, tid: int, tgid: int, delta: list[int]
) -> FaultStats:
    """FaultStats from one thread's counter deltas: counts by class, then ns by class,
    then untimed (the layout of thread_faults in faults.bpf.c)."""
    n = len(FAULT_CLASSES)
    counts, times = delta[:n], delta[n : 2 * n]
    return FaultStats(
        ts_ns=now_ns - interval_ns,
        interval_ns=interval_ns,
        tid=tid,
        tgid=tgid,
        minor_count=counts[CLS_MINOR],
        minor_ns=times[CLS_MINOR],
        file_count=counts[CLS_FILE],
        file_ns=times[CLS_FILE],
        swap_count=counts[CLS_SWAP],
        swap_ns=times[CLS_SWAP],
        unclassified_count=counts[CLS_UNCLASSIFIED],
        unclassified_ns=times[CLS_UNCLASSIFIED],
        untimed_count=delta[2 * n],
    )


def decode(rec: Any) -> Event:
    common = {"ts_ns": rec.ts_ns, "tid": rec.tid, "tgid": rec.tgid, "cpu": rec.cpu}
    if rec.cls == CLS_MINOR:
        return MinorFaults(**common, end_ns=rec.end_ns, count=rec.count, total_ns=rec.total_ns)
    kind: Literal["file", "swap"] = "file" if rec.cls == CLS_FILE else "swap"
    return MajorFault(
        **common, dur_ns=rec.total_ns, kind=kind, address=rec.address, comm=comm_str(rec.comm)
    )


class FaultProbe(Probe):
    """The faults or swap registry entry: a member of its probe set's FaultPrograms."""

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.loaded: FaultPrograms | None = None

    def parts(self, ctx: ProbeContext) -> list[ModulePart]:
        return [FaultPrograms.of(ctx).part(ctx)]

    def start(self, ctx: ProbeContext) -> None:
        missing = [
            h for h in self.spec.hooks if h.kind == "tracepoint" and not tracepoint_exists(h.target)
        ]
        required = [str(h) for h in missing if not h.optional]
        if required:
            raise ProbeUnavailable(f"this kernel lacks {', '.join(required)}")
        self._emit = ctx.emit
        self.loaded = FaultPrograms.of(ctx)
        self.loaded.join(self, ctx)
        reasons = [f"no {h}: {DEGRADED[h.target]}" for h in missing]
        if self.loaded.caveat:
            reasons.append(self.loaded.caveat)
        self.state = "degraded" if reasons else "running"
        self.reason = "; ".join(reasons)

    @property
    def joined(self) -> FaultPrograms:
        assert self.loaded is not None, f"{self.name} probe used before start"
        return self.loaded

    def poll(self) -> None:
        self.joined.poll()

    def ring_fds(self) -> list[int]:
        return self.joined.ring_fds()

    def sample(self, now_ns: int) -> Iterable[Event]:
        return self.joined.sample(self, now_ns)

    def lost_kernel(self) -> int:
        if self.loaded is None or self.loaded.bpf is None:
            return 0
        return self.loaded.lost(self)

    def histograms(self) -> dict[str, list[int]]:
        return self.joined.histograms()

    def programs(self) -> list[int]:
        """The shared object's programs, counted once: with the first member that joined
        (swap's own cost is then in faults')."""
        if self.loaded is None or self.cost_counted_with():
            return []
        return program_fds(self.loaded.bpf)

    def cost_counted_with(self) -> str:
        first = next(iter(self.loaded.members), self.name) if self.loaded else self.name
        return "" if first == self.name else first

    def close(self) -> None:
        if self.loaded is not None and self.state in ("running", "degraded"):
            self.loaded.leave(self)
            self.state = "stopped"


DEGRADED = {
    FILEMAP_FAULT: "major faults are counted as unclassified, not split into file and swap",
    BIO_QUEUE: "swap-ins are counted as unclassified major faults",
}

FAULT_HOOKS = (
    *(Hook("tracepoint", target) for target in ENTRY_HOOKS),
    *(Hook("perf_event", f"software:{name}") for name, _, _ in PERF_HOOKS),
)

SPECS = (
    ProbeSpec(
        name="faults",
        summary="minor and major page faults per thread, with time; major split file/swap",
        default_on=True,
        hooks=(
            *FAULT_HOOKS,
            Hook("tracepoint", FILEMAP_FAULT, optional=True),
            Hook("tracepoint", BIO_QUEUE, optional=True),
        ),
        degrades="page-fault time is not attributed (it shows as on-CPU time)",
        factory=FaultProbe,
        # minor: fault time that makes a window worth streaming; minor_window: longest span
        # of one window; storm_gap: faults that came at most this far apart on average, with
        # no switch of the thread between them, are a storm, whose time is all fault time
        # (a fault costs 2.5-3.6 us here, 10 on the loaded VM); major:
        # shortest file-backed major fault streamed.
        thresholds={
            "minor": 1_000_000,
            "minor_window": 100_000_000,
            "storm_gap": 20_000,
            "major": 10_000,
        },
    ),
    ProbeSpec(
        name="swap",
        summary="swap-ins per thread (anonymous/shmem pages read back from swap), with time",
        default_on=True,
        hooks=(
            *FAULT_HOOKS,
            Hook("tracepoint", FILEMAP_FAULT),
            Hook("tracepoint", BIO_QUEUE),
        ),
        degrades="time blocked in swap-ins is not attributed (it shows as blocked time)",
        factory=FaultProbe,
        thresholds={"swapin": 10_000},
    ),
)
