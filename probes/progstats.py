"""Per-program counters the kernel keeps for every loaded BPF program: how often it ran and
for how long (only while sysctl kernel.bpf_stats_enabled=1), and how often it was skipped
because another BPF program was already running on that CPU (always counted: an interrupt
that arrives while a program runs in softirq context loses its own program's run)."""

from __future__ import annotations

import ctypes as ct
from dataclasses import dataclass
from typing import Any

# struct bpf_prog_info (uapi/linux/bpf.h) up to recursion_misses; the kernel fills the
# prefix it is given and ignores the rest, so older and newer kernels both answer.
_RUN_TIME_OFFSET = 192
_INFO_SIZE = 216


class _ProgInfo(ct.Structure):
    _fields_ = [
        ("head", ct.c_uint8 * _RUN_TIME_OFFSET),
        ("run_time_ns", ct.c_uint64),
        ("run_cnt", ct.c_uint64),
        ("recursion_misses", ct.c_uint64),
    ]


assert ct.sizeof(_ProgInfo) == _INFO_SIZE


@dataclass(frozen=True, slots=True)
class ProgStats:
    run_cnt: int
    run_time_ns: int
    recursion_misses: int


def prog_stats(fd: int) -> ProgStats:
    """The counters of the BPF program behind `fd` (bcc: `bpf.funcs[name].fd`)."""
    from bcc.libbcc import lib

    info = _ProgInfo()
    size = ct.c_uint32(ct.sizeof(info))
    lib.bpf_obj_get_info.argtypes = [ct.c_int, ct.c_void_p, ct.POINTER(ct.c_uint32)]
    if lib.bpf_obj_get_info(fd, ct.byref(info), ct.byref(size)) != 0:
        return ProgStats(0, 0, 0)
    return ProgStats(int(info.run_cnt), int(info.run_time_ns), int(info.recursion_misses))


def loaded_prog_stats(bpf: Any) -> dict[str, ProgStats]:
    """Counters of every program a bcc BPF object has loaded, by function name."""
    return {name.decode(): prog_stats(fn.fd) for name, fn in bpf.funcs.items()}
