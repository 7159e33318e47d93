"""Raw tracepoints with a cookie (Linux >= 6.10): one program on several tracepoints, each
attachment with its own number that the program reads (bpf_get_attach_cookie). bcc 0.26
attaches a raw tracepoint without one, so a program that must know which of its hooks ran
was compiled once per hook (irq's system vectors: 12 of its 16 programs, ~0.08 CPU-s of the
default module's compile on the development VM; docs/performance.md).
"""

from __future__ import annotations

import ctypes as ct
import functools
import os
from collections.abc import Mapping
from typing import Any

from gpujitter.probes import bpf_syscall

BPF_RAW_TRACEPOINT_OPEN = 17
BPF_PROG_TYPE_RAW_TRACEPOINT = 17
# r0 = bpf_get_attach_cookie(ctx) (helper 174, ctx still in r1); r0 = 0; exit
_READS_COOKIE = bytes.fromhex("85000000ae000000b7000000000000009500000000000000")


class _RawTracepointOpen(ct.Structure):
    """union bpf_attr, as BPF_RAW_TRACEPOINT_OPEN reads it (the cookie since 6.10)."""

    _fields_ = [
        ("name", ct.c_uint64),
        ("prog_fd", ct.c_uint32),
        ("_pad", ct.c_uint32),
        ("cookie", ct.c_uint64),
    ]


@functools.cache
def supported() -> bool:
    """Whether a raw tracepoint program may read its attachment's cookie here, asked once per
    process without compiling anything: a kernel before 6.10 refuses the helper in such a
    program (and the cookie in the attach)."""
    try:
        os.close(bpf_syscall.load(BPF_PROG_TYPE_RAW_TRACEPOINT, _READS_COOKIE))
    except OSError:
        return False
    return True


def wanted(options: Mapping[str, Any]) -> bool:
    """Whether a probe with these options (its part of ProbeContext.options) shares one
    program among its raw tracepoints: the kernel passes cookies and the option
    `tp_cookies` is not off."""
    return bool(options.get("tp_cookies", True)) and supported()


def attach(prog_fd: int, event: str, cookie: int) -> int:
    """Attach a loaded raw tracepoint program to `event` with `cookie`; the attachment's fd
    (closing it detaches), or OSError when refused."""
    name = ct.create_string_buffer(event.encode())
    attr = _RawTracepointOpen(name=ct.addressof(name), prog_fd=prog_fd, cookie=cookie)
    return bpf_syscall.bpf(BPF_RAW_TRACEPOINT_OPEN, attr)
