"""System call numbers -> names, for the blocked-time evidence (the sched probe reports the
number a thread blocked in). Only calls a feeding thread plausibly blocks in are named; others
print as "syscall N". Numbers differ per ABI: x86_64 has its own table, arm64 uses the generic
one (asm-generic/unistd.h)."""

from __future__ import annotations

_X86_64 = {
    0: "read",
    1: "write",
    3: "close",
    7: "poll",
    9: "mmap",
    11: "munmap",
    12: "brk",
    16: "ioctl",
    17: "pread64",
    18: "pwrite64",
    19: "readv",
    20: "writev",
    23: "select",
    24: "sched_yield",
    25: "mremap",
    26: "msync",
    28: "madvise",
    34: "pause",
    35: "nanosleep",
    42: "connect",
    43: "accept",
    44: "sendto",
    45: "recvfrom",
    46: "sendmsg",
    47: "recvmsg",
    61: "wait4",
    74: "fsync",
    75: "fdatasync",
    202: "futex",
    208: "io_getevents",
    230: "clock_nanosleep",
    232: "epoll_wait",
    247: "waitid",
    257: "openat",
    270: "pselect6",
    271: "ppoll",
    281: "epoll_pwait",
    288: "accept4",
    295: "preadv",
    327: "preadv2",
    426: "io_uring_enter",
    441: "epoll_pwait2",
    449: "futex_waitv",
}

_GENERIC = {
    4: "io_getevents",
    22: "epoll_pwait",
    29: "ioctl",
    56: "openat",
    57: "close",
    63: "read",
    64: "write",
    65: "readv",
    66: "writev",
    67: "pread64",
    68: "pwrite64",
    69: "preadv",
    72: "pselect6",
    73: "ppoll",
    82: "fsync",
    83: "fdatasync",
    95: "waitid",
    98: "futex",
    101: "nanosleep",
    115: "clock_nanosleep",
    124: "sched_yield",
    202: "accept",
    203: "connect",
    206: "sendto",
    207: "recvfrom",
    211: "sendmsg",
    212: "recvmsg",
    214: "brk",
    215: "munmap",
    216: "mremap",
    222: "mmap",
    227: "msync",
    233: "madvise",
    242: "accept4",
    260: "wait4",
    286: "preadv2",
    426: "io_uring_enter",
    441: "epoll_pwait2",
    449: "futex_waitv",
}

ABIS = {"x86_64": _X86_64, "arm64": _GENERIC, "aarch64": _GENERIC}

# Blocking in these is the thread's own choice of time: whoever wakes it is the timer, so the
# wait is never followed into the waker's timeline.
SLEEPS = frozenset({"nanosleep", "clock_nanosleep", "pause"})


def syscall_name(nr: int, abi: str = "x86_64") -> str:
    if nr < 0:
        return ""
    return ABIS.get(abi, _X86_64).get(nr, f"syscall {nr}")
