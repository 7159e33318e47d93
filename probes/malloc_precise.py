"""malloc, precise mode: time every allocator call of chosen processes for a bounded window
with uprobes (malloc_uprobes.bpf.c) and deliver the calls slower than a threshold as
AllocCall. The malloc probe owns one of these while the window is open; when it closes,
the uprobes are detached and the processes run at full speed again.
"""

from __future__ import annotations

import ctypes as ct
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpujitter.probes import uprobe_multi
from gpujitter.probes.base import ProbeUnavailable, compile_bpf, consume_rings
from gpujitter.probes.events import AllocCall, Event
from gpujitter.probes.malloc_sites import SIZE_PROGRAMS, Site, allocator_sites
from gpujitter.units import format_ns

MAX_WINDOW_NS = 3600 * 1_000_000_000  # the mode is for a look, not a way of life


class PreciseWindow:
    def __init__(
        self,
        pids: Iterable[int],
        window_ns: int,
        threshold_ns: int,
        deliver: Callable[[Event], None],
        *,
        linked: bool = True,
    ) -> None:
        self.pids = sorted({int(p) for p in pids})
        self.window_ns = int(window_ns)
        self.threshold_ns = threshold_ns
        self.deliver = deliver
        self.bpf: Any = None
        self.sites: dict[tuple[int, int], Site] = {}  # (tgid, probe address) -> site
        # Uprobe-multi links (fds), two per file per process, where `linked` (the kernel makes
        # them and the option allows, uprobe_multi.wanted): the window's end then waits for
        # the kernel once, not once per breakpoint (~110 ms each on the 2-CPU VM, quiet or
        # busy: 12 of them outlasted a second).
        self.links: list[int] = []
        self.linked = linked
        self.start_ns = 0
        self.deadline_ns = 0
        self.timed = self.slow = self.lost = 0
        self.skipped: list[str] = []  # pids that could not be probed, and why
        self._ring_open = False

    def start(self) -> str:
        """Find each process's allocator entry points and attach; the description of what
        is probed. ProbeUnavailable when nothing could be."""
        if not 0 < self.window_ns <= MAX_WINDOW_NS:
            raise ProbeUnavailable(
                f"precise window must be between 0 and 1h, not {format_ns(self.window_ns)}"
            )
        per_pid: dict[int, list[Site]] = {}
        for pid in self.pids:
            try:
                sites = allocator_sites(pid)
            except OSError as problem:
                self.skipped.append(f"pid {pid}: {problem.strerror or problem}")
                continue
            if not sites:
                self.skipped.append(f"pid {pid}: no allocator mapped")
                continue
            per_pid[pid] = sites
        if not per_pid:
            raise ProbeUnavailable("; ".join(self.skipped) or "no process to probe")
        flags = [f"-DTHRESHOLD_CALL_NS={self.threshold_ns}ULL"]

        def attach(bpf: Any) -> None:
            for pid, sites in per_pid.items():
                if self.linked:
                    self._link(bpf, pid, sites)
                else:
                    for site in sites:
                        addr = site.elf_addr + site.skip
                        name = os.fsencode(site.path)  # bytes: bcc encodes a str strictly
                        bpf.attach_uprobe(name=name, addr=addr, fn_name=site.program, pid=pid)
                        bpf.attach_uretprobe(name=name, addr=addr, fn_name="leave", pid=pid)
                for site in sites:
                    self.sites[(pid, site.addr)] = site

        try:
            self.bpf = compile_bpf(Path(__file__).with_name("malloc_uprobes.bpf.c"), flags, attach)
        except ProbeUnavailable:
            self._unlink()
            self.sites.clear()
            raise
        self.bpf["slow_calls"].open_ring_buffer(self._on_call)
        self._ring_open = True
        # Opened once every probe is in: the compile and the attaches (~0.6 s here) would
        # otherwise be taken out of the window asked for.
        self.start_ns = time.monotonic_ns()
        self.deadline_ns = self.start_ns + self.window_ns
        self.bpf["window"][ct.c_int(0)] = ct.c_uint64(self.deadline_ns)
        return self.describe(per_pid)

    def _link(self, bpf: Any, pid: int, sites: list[Site]) -> None:
        """Every site of `pid` through two links per file: the entries (the cookie says
        where the size is) and the returns."""
        enter = uprobe_multi.load_program(bpf, "enter_linked")
        leave = uprobe_multi.load_program(bpf, "leave")
        by_file: dict[str, list[Site]] = {}
        for site in sites:
            by_file.setdefault(site.path, []).append(site)
        for path, in_file in by_file.items():
            offsets = [site.offset for site in in_file]
            kinds = [SIZE_PROGRAMS.index(site.program) for site in in_file]
            self.links.append(
                uprobe_multi.link(enter, path, offsets, kinds, returns=False, pid=pid)
            )
            zeros = [0] * len(offsets)
            self.links.append(uprobe_multi.link(leave, path, offsets, zeros, returns=True, pid=pid))

    def _unlink(self) -> None:
        while self.links:
            os.close(self.links.pop())

    def describe(self, per_pid: dict[int, list[Site]]) -> str:
        parts = []
        for pid, sites in per_pid.items():
            allocs = sorted({s.allocator for s in sites})
            past = sum(1 for s in sites if s.skip)
            parts.append(
                f"pid {pid} ({'+'.join(allocs)}: {len(sites)} entry points"
                + (f", {past} past endbr64" if past else "")
                + ")"
            )
        skipped = f"; skipped {'; '.join(self.skipped)}" if self.skipped else ""
        return f"precise mode for {format_ns(self.window_ns)} on {', '.join(parts)}{skipped}"

    def _on_call(self, _ctx: Any, data: int, _size: int) -> int:
        rec = self.bpf["slow_calls"].event(data)
        site = self.sites.get((rec.tgid, rec.ip))
        self.deliver(
            AllocCall(
                ts_ns=rec.ts_ns,
                dur_ns=rec.dur_ns,
                tid=rec.tid,
                tgid=rec.tgid,
                cpu=rec.cpu,
                func=site.func if site else f"?{rec.ip:#x}",
                allocator=site.allocator if site else "?",
                size=rec.size,
            )
        )
        return 0

    @property
    def open(self) -> bool:
        return self.bpf is not None

    def poll(self, now_ns: int) -> bool:
        """Deliver what the kernel queued; close when the window is over. True when this
        call closed it."""
        if self.bpf is None:
            return False
        consume_rings(self.bpf)
        if now_ns < self.deadline_ns:
            return False
        self.close()
        return True

    def _read_counters(self) -> None:
        counts = self.bpf["counts"]
        self.timed = sum(int(v) for v in counts[0])
        self.slow = sum(int(v) for v in counts[1])
        self.lost = sum(int(v) for v in self.bpf["gj_lost"][0])

    def lost_kernel(self) -> int:
        if self.bpf is not None:
            self._read_counters()
        return self.lost

    def close(self) -> None:
        """Detach (the breakpoints leave the processes' code), keep the final counters."""
        if self.bpf is None:
            return
        if self._ring_open:
            consume_rings(self.bpf)
        self._read_counters()
        self._unlink()
        self.bpf.cleanup()
        self.bpf = None

    def summary(self, now_ns: int) -> str:
        return (
            f"precise mode ended after {format_ns(now_ns - self.start_ns)}: "
            f"{self.timed} calls timed, {self.slow} over {format_ns(self.threshold_ns)}"
        )
