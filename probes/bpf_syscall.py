"""The bpf() system call, for what bcc 0.26 does not offer (uprobe-multi links, raw
tracepoints with a cookie, run-time statistics held by an fd), and a hand-written program's
load to ask the kernel what it takes before anything is compiled.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import platform

BPF_PROG_LOAD = 5
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
_libc = ct.CDLL(None, use_errno=True)


class ProgLoad(ct.Structure):
    """union bpf_attr, as BPF_PROG_LOAD reads it (up to expected_attach_type)."""

    _fields_ = [
        ("prog_type", ct.c_uint32),
        ("insn_cnt", ct.c_uint32),
        ("insns", ct.c_uint64),
        ("license", ct.c_uint64),
        ("log_level", ct.c_uint32),
        ("log_size", ct.c_uint32),
        ("log_buf", ct.c_uint64),
        ("kern_version", ct.c_uint32),
        ("prog_flags", ct.c_uint32),
        ("prog_name", ct.c_char * 16),
        ("prog_ifindex", ct.c_uint32),
        ("expected_attach_type", ct.c_uint32),
    ]


def bpf(command: int, attr: ct.Structure) -> int:
    """The bpf() system call; the fd it returns, or OSError."""
    if _SYS_BPF is None:
        raise OSError(errno.ENOSYS, f"bpf() not wired for {platform.machine()}")
    fd = int(_libc.syscall(ct.c_long(_SYS_BPF), ct.c_int(command), ct.byref(attr),
                           ct.c_uint(ct.sizeof(attr))))  # fmt: skip
    if fd < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def load(prog_type: int, insns: bytes, expected_attach_type: int = 0) -> int:
    """Load a hand-written program (GPL); its fd, or OSError where the verifier refuses it."""
    code = ct.create_string_buffer(insns, len(insns))
    license_ = ct.create_string_buffer(b"GPL")
    attr = ProgLoad(
        prog_type=prog_type,
        insn_cnt=len(insns) // 8,
        insns=ct.addressof(code),
        license=ct.addressof(license_),
        expected_attach_type=expected_attach_type,
    )
    return bpf(BPF_PROG_LOAD, attr)
