"""Writes a minimal 64-bit ELF shared object holding only a symbol table: what the native-names
bench and tests need of a file (libtorch's hundreds of thousands of mangled C++ functions,
or symbols laid out to test one rule) without a compiler that would take minutes to build it.

The one loadable segment maps the file from address 0 upwards, so a function's address is
its file offset; the functions have no code, only their symbols.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from gpujitter.probes.elf import SHT_DYNSYM, STB_GLOBAL, STT_FUNC

SHT_PROGBITS, SHT_STRTAB = 1, 3
SEGMENT_BYTES = 1 << 40  # the segment's size in the file: every address a test names is in it
_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_PROGRAM = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
TEXT = 1  # the section index every symbol written here is defined in


def mangled(i: int) -> str:
    """A mangled C++ function name in libtorch's style (~70 characters), unique per i."""
    kernel = f"add_kernel_{i}"
    return f"_ZN2at6native{len(kernel)}{kernel}ERNS_18TensorIteratorBaseERKN3c106ScalarE"


def write_elf(
    path: Path,
    symbols: Iterable[tuple[int, int, str]],
    *,
    table: int = SHT_DYNSYM,
    info: int = STB_GLOBAL << 4 | STT_FUNC,
) -> Path:
    """An ELF at `path` whose symbol table (`table`: SHT_DYNSYM or SHT_SYMTAB) holds one
    function per (address, size, name), of type and binding `info`, defined in .text."""
    names = bytearray(b"\0")
    entries = bytearray(_SYMBOL.size)  # entry 0: the null symbol
    for addr, size, name in symbols:
        entries += _SYMBOL.pack(len(names), info, 0, TEXT, addr, size)
        names += name.encode() + b"\0"
    section_names = b"\0.text\0.symbols\0.names\0.shstrtab\0"
    symbols_at = _HEADER.size + _PROGRAM.size
    names_at = symbols_at + len(entries)
    shstr_at = names_at + len(names)
    sections_at = (shstr_at + len(section_names) + 7) // 8 * 8
    sections = [
        _SECTION.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        _SECTION.pack(1, SHT_PROGBITS, 6, 0, 0, 0, 0, 0, 16, 0),
        _SECTION.pack(7, table, 2, 0, symbols_at, len(entries), 3, 1, 8, _SYMBOL.size),
        _SECTION.pack(16, SHT_STRTAB, 2, 0, names_at, len(names), 0, 0, 1, 0),
        _SECTION.pack(23, SHT_STRTAB, 0, 0, shstr_at, len(section_names), 0, 0, 1, 0),
    ]
    header = _HEADER.pack(b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0, _HEADER.size,
                          sections_at, 0, _HEADER.size, _PROGRAM.size, 1, _SECTION.size,
                          len(sections), 4)  # fmt: skip
    segment = _PROGRAM.pack(1, 5, 0, 0, 0, SEGMENT_BYTES, SEGMENT_BYTES, 4096)
    body = header + segment + entries + names + section_names
    path.write_bytes(body + bytes(sections_at - len(body)) + b"".join(sections))
    return path
