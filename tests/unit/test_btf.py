"""BTF offsets: fields found through anonymous members, bit fields and missing names refused
with one line, a blob that is not BTF refused; and the running kernel's task_struct."""

from __future__ import annotations

import struct

import pytest

from gpujitter.probes import btf


def blob(types: list[tuple[str, int, int, int, list[tuple[str, int, int]]]]) -> bytes:
    """A BTF blob: each type (name, kind, kind_flag, size, members (name, type id, offset))."""
    strings = b"\0"
    offsets: dict[str, int] = {"": 0}

    def name(s: str) -> int:
        nonlocal strings
        if s not in offsets:
            offsets[s] = len(strings)
            strings += s.encode() + b"\0"
        return offsets[s]

    body = b""
    for tname, kind, flag, size, members in types:
        info = (kind << 24) | (flag << 31) | len(members)
        body += struct.pack("<3I", name(tname), info, size)
        if kind == 1:  # INT
            body += struct.pack("<I", 32)
        for m_name, m_type, m_off in members:
            body += struct.pack("<3I", name(m_name), m_type, m_off)
    header = struct.pack("<HBBI4I", btf.BTF_MAGIC, 1, 0, 24, 0, len(body), len(body), len(strings))
    return header + body + strings


TYPES = [
    ("int", 1, 0, 4, []),  # id 1
    ("", 5, 0, 8, [("a", 1, 0), ("b", 1, 0)]),  # id 2: an anonymous union
    ("inner", 4, 0, 8, [("x", 1, 0), ("y", 1, 32)]),  # id 3
    ("outer", 4, 0, 32, [("first", 1, 0), ("", 2, 64), ("in", 3, 128)]),  # id 4
    ("bits", 4, 1, 4, [("lo", 1, (3 << 24) | 0), ("hi", 1, (5 << 24) | 3)]),  # id 5
]


def test_offsets_through_anonymous_and_nested_members() -> None:
    b = btf.Btf(blob(TYPES))
    assert b.offset("outer", "first") == 0
    assert b.offset("outer", "b") == 8  # inside the anonymous union at bit 64
    assert b.offset("outer", "in.y") == 20
    assert b.offset("inner", "y") == 4


def test_missing_names_and_bit_fields_are_refused() -> None:
    b = btf.Btf(blob(TYPES))
    with pytest.raises(btf.BtfError, match="no struct nope"):
        b.offset("nope", "x")
    with pytest.raises(btf.BtfError, match=r"no field in\.z"):
        b.offset("outer", "in.z")
    with pytest.raises(btf.BtfError, match="bit field"):
        b.offset("bits", "hi")


def test_not_btf_is_refused() -> None:
    with pytest.raises(btf.BtfError, match="not BTF"):
        btf.Btf(b"\0" * 64)


def test_the_running_kernels_task_struct() -> None:
    assert btf.VMLINUX_BTF.exists(), "this kernel has no BTF"
    flags = btf.offset_cflags("TASK", "task_struct", ("pid", "tgid", "comm"))
    offsets = dict(f[2:].split("=") for f in flags)
    # tgid follows pid (both pid_t) in every kernel version
    assert int(offsets["TASK_TGID"]) == int(offsets["TASK_PID"]) + 4
