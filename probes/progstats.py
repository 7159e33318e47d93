"""Per-program counters the kernel keeps for every loaded BPF program (shown in the program
fd's /proc fdinfo): how often it ran and for how long (only while BPF run-time statistics
are on), and how often it was skipped because it was already running on that CPU (always
counted: an event that fires inside the program's own run is lost). CostMeter turns them
into each probe's cost per second, switching the statistics on briefly when nobody has."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujitter.probes import bpf_syscall
from gpujitter.probes.host import read_raw

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
# bpf(BPF_ENABLE_STATS, {type = BPF_STATS_RUN_TIME}): statistics stay on while the returned
# fd is open, counted per holder, so neither the sysctl nor another holder is disturbed.
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
SAMPLE_EVERY_NS = 60_000_000_000  # sampled mode: one measured stretch a minute
SAMPLE_FOR_NS = 1_000_000_000  # of about a second (the statistics cost two clock reads a run)
# A stretch shorter than this measures nothing: over microseconds (two reads back to back)
# most programs did not run at all and one that ran once reads as tens of thousands a second.
MIN_STRETCH_NS = 200_000_000


@dataclass(frozen=True, slots=True)
class ProgStats:
    run_cnt: int = 0
    run_time_ns: int = 0
    recursion_misses: int = 0


def prog_stats(fd: int) -> ProgStats:
    """The counters of the BPF program behind `fd` (bcc: `bpf.funcs[name].fd`); zeros when
    the kernel does not show them."""
    raw = read_raw(f"/proc/{os.getpid()}/fdinfo/{fd}")  # every program, once a second
    if raw is None:
        return ProgStats()
    fields = dict(line.split(b":", 1) for line in raw.splitlines() if b":" in line)
    return ProgStats(
        *(int(fields.get(k, b"0")) for k in (b"run_cnt", b"run_time_ns", b"recursion_misses"))
    )


def loaded_prog_stats(bpf: Any) -> dict[str, ProgStats]:
    """Counters of every program a bcc BPF object has loaded, by function name."""
    return {name.decode(): prog_stats(fn.fd) for name, fn in bpf.funcs.items()}


def program_fds(bpf: Any) -> list[int]:
    """The program fds of a bcc BPF object (none when it is gone)."""
    return [] if bpf is None else [fn.fd for fn in bpf.funcs.values()]


def stats_on() -> bool:
    try:
        return STATS_SYSCTL.read_text().strip() == "1"
    except OSError:
        return False


class _EnableStats(ctypes.Structure):
    """union bpf_attr, as BPF_ENABLE_STATS reads it."""

    _fields_ = [("type", ctypes.c_uint32)]


def enable_stats() -> int:
    """An fd that keeps BPF run-time statistics on until closed; -1 when refused."""
    try:
        return bpf_syscall.bpf(BPF_ENABLE_STATS, _EnableStats(BPF_STATS_RUN_TIME))
    except OSError:
        return -1


@dataclass(frozen=True, slots=True)
class Cost:
    ns_per_s: int = -1
    runs_per_s: int = -1
    source: str = ""


def _totals(fds: Iterable[int]) -> tuple[int, int]:
    runs = ns = 0
    for fd in fds:
        st = prog_stats(fd)
        runs += st.run_cnt
        ns += st.run_time_ns
    return runs, ns


class CostMeter:
    """Each probe's BPF cost per second. Where kernel.bpf_stats_enabled is on, the counters
    run all the time and every tick measures the last interval; otherwise the meter holds
    the statistics on (enable_stats) for about a second each minute and keeps that
    stretch's figures until the next one."""

    def __init__(self) -> None:
        self.costs: dict[str, Cost] = {}
        self._fd = -1
        self._opened_ns = 0
        self._next_ns = 0
        self.refused = False  # the kernel refused to switch the statistics on (last asked)
        # probe -> (its program fds, t, runs, ns) at the last read
        self._last: dict[str, tuple[tuple[int, ...], int, int, int]] = {}

    def tick(self, now_ns: int, programs: Callable[[], Mapping[str, list[int]]]) -> dict[str, Cost]:
        """The costs as of now; `programs` (each probe's program fds) is asked for only
        when the counters are read: in sampled mode, a tick in about sixty."""
        continuous = stats_on()
        if continuous:
            self._close()
            self.refused = False
        elif self._fd < 0:
            if now_ns < self._next_ns:
                return self.costs
            self._fd = enable_stats()
            self._opened_ns, self._next_ns = now_ns, now_ns + SAMPLE_EVERY_NS
            self._last = {}
            self.refused = self._fd < 0
            if self.refused:
                return self.costs
        source = "bpf_stats" if continuous else "sampled"
        for probe, fds in programs().items():
            held = tuple(sorted(fds))
            last = self._last.get(probe)
            if last is not None and last[0] == held and now_ns - last[1] < MIN_STRETCH_NS:
                continue  # the stretch goes on from the earlier read; its cost stands
            t, runs, ns = now_ns, *_totals(fds)
            self._last[probe] = (held, t, runs, ns)
            # Over programs that came or went since (a uprobe on a new interpreter, say) the
            # totals are not one set's: that stretch only starts the next one.
            if last is not None and last[0] == held and fds:
                secs = (t - last[1]) / 1e9
                self.costs[probe] = Cost(
                    round((ns - last[3]) / secs), round((runs - last[2]) / secs), source
                )
        if not continuous and now_ns - self._opened_ns >= SAMPLE_FOR_NS:
            self._close()
        return self.costs

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self._close()
