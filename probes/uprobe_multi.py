"""Uprobe-multi links (Linux >= 6.6): one BPF link puts one program on many addresses of a
file, each address with a cookie the program reads (bpf_get_attach_cookie). bcc 0.26 only
attaches one perf event per address, and the kernel detaches those one at a time with an RCU
wait each (~100-150 ms on 6.18: a libcuda's 59 took 6-9 s); a link detaches in one wait.
"""

from __future__ import annotations

import ctypes as ct
import errno
import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from gpujitter.probes import bpf_syscall

BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type
BPF_F_UPROBE_MULTI_RETURN = 1


class _LinkCreate(ct.Structure):
    """union bpf_attr, as BPF_LINK_CREATE reads it for BPF_TRACE_UPROBE_MULTI."""

    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("path", ct.c_uint64),
        ("offsets", ct.c_uint64),
        ("ref_ctr_offsets", ct.c_uint64),
        ("cookies", ct.c_uint64),
        ("cnt", ct.c_uint32),
        ("multi_flags", ct.c_uint32),
        ("pid", ct.c_uint32),
        ("_pad", ct.c_uint32),
    ]


BPF_PROG_TYPE_KPROBE = 2
_RETURN_ZERO = bytes.fromhex("b7000000000000009500000000000000")  # r0 = 0; exit


@functools.cache
def supported() -> bool:
    """Whether this kernel makes uprobe-multi links, asked once per process without compiling
    anything: a do-nothing program is linked to a file that does not exist, which such a
    kernel refuses with ENOENT (it got as far as the path) and an older one with EINVAL."""
    try:
        prog = bpf_syscall.load(BPF_PROG_TYPE_KPROBE, _RETURN_ZERO, BPF_TRACE_UPROBE_MULTI)
    except OSError:
        return False
    try:
        os.close(link(prog, "/nonexistent/gpujitter-uprobe-multi-check", [0], [0], returns=False))
    except OSError as err:
        return err.errno == errno.ENOENT
    finally:
        os.close(prog)
    return True  # cannot happen (no such file), but a link made is a link the kernel has


def wanted(options: Mapping[str, Any]) -> bool:
    """Whether a probe with these options (its part of ProbeContext.options) uses links: the
    kernel makes them and the option `uprobe_multi` is not off."""
    return bool(options.get("uprobe_multi", True)) and supported()


def load_program(bpf: Any, fn_name: str) -> int:
    """Load `fn_name` of a compiled bcc module as a uprobe-multi program; its fd."""
    from bcc import BPF  # imported here: the registry must load on nodes without bcc

    return int(bpf.load_func(fn_name, BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI).fd)


def link(
    prog_fd: int,
    path: str,
    offsets: Sequence[int],
    cookies: Sequence[int],
    *,
    returns: bool,
    pid: int = 0,
    ref_ctr_offsets: Sequence[int] = (),
) -> int:
    """Attach `prog_fd` at the file offsets of `path` (entry, or return when `returns`), in
    process `pid` only when given (the kernel plants breakpoints in that process alone); the
    link's fd, which detaches everything at once when closed. ref_ctr_offsets: per offset,
    the file offset of a USDT semaphore the kernel raises while attached (0: none). OSError
    when refused."""
    raw_path = ct.create_string_buffer(os.fsencode(path))
    raw_offsets = (ct.c_uint64 * len(offsets))(*offsets)
    raw_cookies = (ct.c_uint64 * len(cookies))(*cookies)
    raw_ref_ctrs = (ct.c_uint64 * len(ref_ctr_offsets))(*ref_ctr_offsets)
    attr = _LinkCreate(
        prog_fd=prog_fd,
        attach_type=BPF_TRACE_UPROBE_MULTI,
        path=ct.addressof(raw_path),
        offsets=ct.addressof(raw_offsets),
        ref_ctr_offsets=ct.addressof(raw_ref_ctrs) if any(ref_ctr_offsets) else 0,
        cookies=ct.addressof(raw_cookies),
        cnt=len(offsets),
        multi_flags=BPF_F_UPROBE_MULTI_RETURN if returns else 0,
        pid=pid,
    )
    try:
        return bpf_syscall.bpf(BPF_LINK_CREATE, attr)
    except OSError as err:
        raise OSError(err.errno, f"uprobe-multi link on {path}: {err.strerror}") from None
