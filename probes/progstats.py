"""Per-program counters the kernel keeps for every loaded BPF program (shown in the program
fd's /proc fdinfo): how often it ran and for how long (only while sysctl
kernel.bpf_stats_enabled=1), and how often it was skipped because it was already running
on that CPU (always counted: an event that fires inside the program's own run is lost)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ProgStats:
    run_cnt: int = 0
    run_time_ns: int = 0
    recursion_misses: int = 0


def prog_stats(fd: int) -> ProgStats:
    """The counters of the BPF program behind `fd` (bcc: `bpf.funcs[name].fd`); zeros when
    the kernel does not show them."""
    try:
        with open(f"/proc/{os.getpid()}/fdinfo/{fd}") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return ProgStats()
    return ProgStats(
        *(int(fields.get(k, "0")) for k in ("run_cnt", "run_time_ns", "recursion_misses"))
    )


def loaded_prog_stats(bpf: Any) -> dict[str, ProgStats]:
    """Counters of every program a bcc BPF object has loaded, by function name."""
    return {name.decode(): prog_stats(fn.fd) for name, fn in bpf.funcs.items()}
