"""The one ELF reader of the probes: symbols, loadable segments, sections and code bytes of a
64-bit little-endian ELF file (the only kind these machines run), with no binutils needed.

The file is mapped, not read: only the pages of what is looked at become resident (a libcuda
is ~100 MB and a libpython tens of MB; reading them whole was the daemon's peak memory).
Addresses are the ELF's own virtual addresses (what bcc's attach_uprobe(addr=) takes);
file_offset turns one into the offset a raw uprobe (perf_event_open, uprobe-multi) takes.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from array import array
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

ENDBR64 = bytes.fromhex("f30f1efa")  # a CET build's first instruction of a function
PT_LOAD = 1
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 1, 2, 10
NT_GNU_BUILD_ID = 3
STB_GLOBAL, STB_WEAK = 1, 2
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym


class ElfFile:
    """One ELF file, mapped read-only until close() (or the end of a `with` block).
    loads: PT_LOAD segments as (vaddr, file offset, size in file); sections: the section
    headers as (name, type, flags, addr, offset, size, link, info, align, entsize)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # O_NONBLOCK: a FIFO's open returns at once (to be refused), never waits for a writer
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path}: not a regular file")
            if st.st_size < 64:  # not even an ELF header (nor mappable)
                raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
            self.data = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping holds the file
        try:
            self._headers()
        except ValueError:
            self.data.close()
            raise
        except (IndexError, OverflowError, struct.error) as err:  # pointing outside the file
            self.data.close()
            raise ValueError(f"{path}: a malformed ELF file ({err})") from None

    def _headers(self) -> None:
        data = self.data
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError(f"{self.path}: not a 64-bit little-endian ELF file")
        phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
        self.loads: list[tuple[int, int, int]] = []
        for i in range(phnum):
            p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from(
                "<IIQQQQ", data, phoff + i * phentsize
            )
            if p_type == PT_LOAD:
                self.loads.append((vaddr, offset, filesz))
        self.sections: list[tuple[int, ...]] = [
            struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
        ]
        self._shstrndx = shstrndx
        self._exported: dict[str, int] | None = None

    def close(self) -> None:
        self.data.close()

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _string(self, offset: int) -> bytes:
        end = self.data.find(b"\0", offset)
        if end < 0:
            raise ValueError(f"{self.path}: a name runs past the end of the file")
        return self.data[offset:end]

    def section(self, name: str) -> tuple[int, ...] | None:
        """The header of the section called `name` (".text", ".stapsdt.base"), None if none."""
        if self._shstrndx >= len(self.sections):
            return None
        names = self.sections[self._shstrndx][4]
        wanted = name.encode()
        for sec in self.sections:
            if self._string(names + sec[0]) == wanted:
                return sec
        return None

    def _tables(self, kinds: tuple[int, ...]) -> Iterator[tuple[int, int, memoryview]]:
        """Each symbol table of `kinds` (SHT_SYMTAB, SHT_DYNSYM) as (where its string table
        starts in the file, that table's size, its entries: Elf64_Sym rows), what of it lies
        inside the file: a table or string table that runs past the end, in part or whole,
        is cut there (a name past its string table is then the reader's to leave out). The
        view is released when the caller asks for the next table."""
        end_of_file = len(self.data)
        for _name, sh_type, _flags, _addr, off, size, link, _info, _align, entsize in self.sections:
            if sh_type not in kinds or entsize not in (0, _SYMBOL.size):
                continue
            if link >= len(self.sections) or off >= end_of_file:
                continue
            strtab, strsize = self.sections[link][4], self.sections[link][5]
            count = min(size, end_of_file - off) // _SYMBOL.size
            table = memoryview(self.data)[off : off + count * _SYMBOL.size]
            try:
                yield strtab, min(strsize, max(0, end_of_file - strtab)), table
            finally:
                table.release()

    def symbols(
        self, names: set[str] | None, stt: int, *, exported: bool = False
    ) -> dict[str, int]:
        """Defined symbols of type `stt` (STT_FUNC, STT_OBJECT) -> their address: those among
        `names` (None: all) from .symtab and .dynsym; exported: only .dynsym's global and weak
        ones (what another object can call). Of a corrupt file, those that lie inside it."""
        tables = (SHT_DYNSYM,) if exported else (SHT_SYMTAB, SHT_DYNSYM)
        wanted = None if names is None else {n.encode(): n for n in names}
        found: dict[str, int] = {}
        for strtab, strsize, table in self._tables(tables):
            for st_name, st_info, _other, shndx, value, _size in _SYMBOL.iter_unpack(table):
                if st_info & 0xF != stt or shndx == 0 or st_name >= strsize:  # defined here
                    continue
                if exported and st_info >> 4 not in (STB_GLOBAL, STB_WEAK):
                    continue
                if not exported and not value:
                    continue
                raw = self._string(strtab + st_name)
                if wanted is None:
                    found[raw.decode(errors="replace")] = value
                elif raw in wanted:
                    found[wanted[raw]] = value
        return found

    def functions(self, names: set[str]) -> dict[str, int]:
        """Defined functions among `names` -> their address (.symtab and .dynsym)."""
        return self.symbols(names, STT_FUNC)

    def exported_functions(self) -> dict[str, int]:
        """Every function the file exports (.dynsym, global or weak) -> its address (walked
        once per file)."""
        if self._exported is None:
            self._exported = self.symbols(None, STT_FUNC, exported=True)
        return self._exported

    def function_entries(self) -> tuple[array, array, array]:
        """Every function with a size in .symtab and .dynsym (an indirect function's resolver
        among them), in table order, as three arrays: start address, end address, and where
        its name starts in the file (native_names.NameFile reads it). Names are not read
        here: libtorch's .dynsym alone holds hundreds of thousands of long C++ names, of
        which a profile names a few. Of a corrupt file, those that lie inside it."""
        starts, ends, names = array("Q"), array("Q"), array("Q")
        for strtab, strsize, table in self._tables((SHT_SYMTAB, SHT_DYNSYM)):
            for st_name, st_info, _other, shndx, value, length in _SYMBOL.iter_unpack(table):
                if (st_info & 0xF in (STT_FUNC, STT_GNU_IFUNC) and shndx and value and length
                        and st_name < strsize and value + length < 1 << 64):  # fmt: skip
                    starts.append(value)
                    ends.append(value + length)
                    names.append(strtab + st_name)
        return starts, ends, names

    def build_id(self) -> str | None:
        """The GNU build id (hex), where the file carries one: it names the file's separate
        debug file (/usr/lib/debug/.build-id/xx/yyyy.debug). None too where a note runs
        past the end of the file."""
        try:
            for _name, sh_type, _flags, _addr, off, size, *_ in self.sections:
                pos = off
                while sh_type == SHT_NOTE and pos + 12 <= off + size:
                    namesz, descsz, kind = struct.unpack_from("<III", self.data, pos)
                    desc = pos + 12 + (namesz + 3) // 4 * 4
                    if kind == NT_GNU_BUILD_ID and self.data[pos + 12 : pos + 16] == b"GNU\0":
                        return self.data[desc : desc + descsz].hex()
                    pos = desc + (descsz + 3) // 4 * 4
        except (OverflowError, struct.error):
            return None
        return None

    def file_offset(self, vaddr: int) -> int:
        """Where address `vaddr` lies in the file; ValueError when in no loadable segment."""
        for start, offset, size in self.loads:
            if start <= vaddr < start + size:
                return vaddr - start + offset
        raise ValueError(f"{self.path}: address {vaddr:#x} is in no loadable segment")

    def code(self, vaddr: int, length: int) -> bytes:
        """Up to `length` bytes of the file at address `vaddr`."""
        offset = self.file_offset(vaddr)
        return self.data[offset : offset + length]

    def entry_skip(self, vaddr: int) -> int:
        """4 when the function at vaddr starts with endbr64 (a CET build), else 0: a uprobe
        on endbr64 is single-stepped (~5x the cost of one past it)."""
        return len(ENDBR64) if self.code(vaddr, len(ENDBR64)) == ENDBR64 else 0
