"""Offsets of kernel struct fields from the running kernel's own BTF (/sys/kernel/btf/vmlinux),
for probes that read a task_struct through bpf_probe_read_kernel from a raw tracepoint. The
installed kernel headers may be another version's, so no offset is ever taken from them:
a probe asks here, and degrades when BTF is missing or lacks a field.
"""

from __future__ import annotations

import struct
from functools import cache
from pathlib import Path

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F

# BTF kinds (include/uapi/linux/btf.h) and the bytes that follow each btf_type record.
KIND_STRUCT, KIND_UNION = 4, 5
_TAIL_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}  # INT, ARRAY, VAR, DECL_TAG
_TAIL_PER_MEMBER = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # STRUCT .. ENUM64
_MAX_KIND = 19


class BtfError(Exception):
    """No usable BTF, or it lacks what was asked: one line why."""


class Btf:
    """Struct and union types of one BTF blob, read lazily: the type section is walked only
    as far as a lookup needs (a whole walk of the kernel's ~150k types costs ~0.4 s here)."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BtfError("BTF too short")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data)
        if magic != BTF_MAGIC:
            raise BtfError(f"not BTF (magic {magic:#x})")
        type_off, type_len, str_off, str_len = struct.unpack_from("<4I", data, 8)
        self._data = data
        self._strings = data[hdr_len + str_off : hdr_len + str_off + str_len]
        self._pos = [0]  # where each type id's record starts (id 0 is void)
        self._next = hdr_len + type_off
        self._end = hdr_len + type_off + type_len

    def _name(self, off: int) -> str:
        end = self._strings.index(b"\0", off)
        return self._strings[off:end].decode()

    def _walk(self, until: int = -1, name_off: int = -1) -> int:
        """Record type positions up to id `until`, or to the first struct or union whose
        name is at `name_off` (its id; 0 when none)."""
        data, pos, unpack = self._data, self._next, struct.unpack_from
        found = 0
        while pos < self._end and not found and (name_off >= 0 or len(self._pos) <= until):
            n_off, info = unpack("<2I", data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind == 0 or kind > _MAX_KIND:
                raise BtfError(f"unknown BTF kind {kind}")
            self._pos.append(pos)
            pos += 12 + _TAIL_FIXED.get(kind, 0) + _TAIL_PER_MEMBER.get(kind, 0) * vlen
            if n_off == name_off and kind in (KIND_STRUCT, KIND_UNION):
                found = len(self._pos) - 1
        self._next = pos
        return found

    def _struct_id(self, name: str) -> int:
        at = self._strings.find(b"\0" + name.encode() + b"\0")
        if at < 0:
            return 0
        for type_id in range(1, len(self._pos)):  # walked already
            n_off, info = struct.unpack_from("<2I", self._data, self._pos[type_id])
            if n_off == at + 1 and ((info >> 24) & 0x1F) in (KIND_STRUCT, KIND_UNION):
                return type_id
        return self._walk(name_off=at + 1)

    def _members(self, type_id: int) -> list[tuple[int, int, int]]:
        """(name offset, type id, bit offset) of a struct or union; [] for other kinds."""
        if type_id >= len(self._pos):
            self._walk(until=type_id)
            if type_id >= len(self._pos):
                return []
        pos = self._pos[type_id]
        _, info = struct.unpack_from("<2I", self._data, pos)
        if ((info >> 24) & 0x1F) not in (KIND_STRUCT, KIND_UNION):
            return []
        bitfields = bool(info >> 31)
        out = []
        for i in range(info & 0xFFFF):
            m_name, m_type, m_off = struct.unpack_from("<3I", self._data, pos + 12 + 12 * i)
            out.append((m_name, m_type, m_off & 0xFFFFFF if bitfields else m_off))
        return out

    def offset(self, struct_name: str, path: str) -> int:
        """Byte offset of `path` ("pid", "se.exec_start") in struct `struct_name`, looking
        through anonymous struct and union members as C does."""
        type_id = self._struct_id(struct_name)
        if not type_id:
            raise BtfError(f"BTF has no struct {struct_name}")
        total_bits = 0
        for part in path.split("."):
            found = self._find(type_id, part)
            if found is None:
                raise BtfError(f"BTF struct {struct_name} has no field {path}")
            type_id, bits = found
            total_bits += bits
        if total_bits % 8:
            raise BtfError(f"{struct_name}.{path} is a bit field")
        return total_bits // 8

    def _find(self, type_id: int, name: str) -> tuple[int, int] | None:
        for m_name, m_type, bit in self._members(type_id):
            if m_name and self._name(m_name) == name:
                return m_type, bit
            if not m_name:  # an anonymous struct or union: its members are this one's
                inner = self._find(m_type, name)
                if inner is not None:
                    return inner[0], bit + inner[1]
        return None


def vmlinux() -> Btf:
    """The running kernel's BTF (~5 MB read in ~15 ms, ~0.3 ms to find task_struct)."""
    try:
        data = VMLINUX_BTF.read_bytes()
    except OSError as err:
        raise BtfError(f"no kernel BTF ({VMLINUX_BTF}: {err.strerror})") from None
    return Btf(data)


@cache
def offset_cflags(prefix: str, struct_name: str, fields: tuple[str, ...]) -> tuple[str, ...]:
    """-D<PREFIX>_<FIELD>=<offset> for each field of `struct_name` (dots become _), from the
    running kernel's BTF. Raises BtfError when BTF is missing or lacks a field. The flags
    are kept, not the BTF: held for the process's life, its bytes were ~8 MB of a daemon's
    resident memory that nothing read after the start."""
    btf = vmlinux()
    return tuple(
        f"-D{prefix}_{f.replace('.', '_').upper()}={btf.offset(struct_name, f)}" for f in fields
    )
