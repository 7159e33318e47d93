"""perf_event_open for the probes that hang a BPF program on a perf event bcc does not offer:
a uprobe with a reference counter (python_gc), a per-thread task-clock (python_stacks)."""

from __future__ import annotations

import ctypes as ct
import os


class PerfEventAttr(ct.Structure):
    _fields_ = [
        ("type", ct.c_uint32),
        ("size", ct.c_uint32),
        ("config", ct.c_uint64),
        ("sample_period", ct.c_uint64),
        ("sample_type", ct.c_uint64),
        ("read_format", ct.c_uint64),
        ("flags", ct.c_uint64),
        ("wakeup_events", ct.c_uint32),
        ("bp_type", ct.c_uint32),
        ("config1", ct.c_uint64),  # uprobe: the path
        ("config2", ct.c_uint64),  # uprobe: the file offset
        ("rest", ct.c_uint8 * 64),
    ]


ATTR_DISABLED = 1  # flags bit: opened disabled
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_BPF = 0x40042408
NR_PERF_EVENT_OPEN = 298  # x86-64

_libc = ct.CDLL(None, use_errno=True)


def bpf_event_fd(attr: PerfEventAttr, pid: int, cpu: int, prog_fd: int, what: str) -> int:
    """Open the perf event `attr` for (pid, cpu), run BPF program prog_fd on it and enable
    it. Returns its fd (close it to stop); raises OSError naming `what`."""
    attr.size = ct.sizeof(PerfEventAttr)
    fd = _libc.syscall(NR_PERF_EVENT_OPEN, ct.byref(attr), pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ct.get_errno()
        raise OSError(err, f"perf_event_open {what}: {os.strerror(err)}")
    if _libc.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd) or _libc.ioctl(
        fd, PERF_EVENT_IOC_ENABLE, 0
    ):
        err = ct.get_errno()
        os.close(fd)
        raise OSError(err, f"attaching BPF to {what}: {os.strerror(err)}")
    return fd


def set_enabled(fd: int, on: bool) -> None:
    """Switch a perf event on or off (its program runs only while on)."""
    _libc.ioctl(fd, PERF_EVENT_IOC_ENABLE if on else PERF_EVENT_IOC_DISABLE, 0)
