"""Where to put allocator uprobes in one process: which allocators /proc/PID/maps shows
(glibc, jemalloc, tcmalloc, or one linked into the executable), the entry points each
defines, and the address of each, moved past `endbr64` when the function starts with one
(a uprobe on endbr64 is single-stepped: ~6.5 us per hit instead of ~1.4 us at +4).

Symbols and code bytes come from the ELF files themselves (64-bit little-endian, the only
kind these machines run), read through /proc/PID/root so that containers work.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from gpujitter.probes.host import HostPaths

ENDBR64 = bytes.fromhex("f30f1efa")

# How each entry point passes the size it allocates; the value names the BPF entry program
# (malloc_uprobes.bpf.c) that reads it.
SIZE_ARG1, SIZE_ARG2, SIZE_ARG3, CALLOC, NO_SIZE = (
    "enter_size1",
    "enter_size2",
    "enter_size3",
    "enter_calloc",
    "enter_nosize",
)
ENTRY_POINTS = {
    "malloc": SIZE_ARG1,
    "calloc": CALLOC,
    "realloc": SIZE_ARG2,
    "free": NO_SIZE,
    "posix_memalign": SIZE_ARG3,
    "aligned_alloc": SIZE_ARG2,
    "memalign": SIZE_ARG2,
}


@dataclass(frozen=True, slots=True)
class Allocator:
    name: str
    file_prefixes: tuple[str, ...]  # shared-object basenames that are this allocator
    symbol_prefixes: tuple[str, ...]  # "" plus the prefix of its own names (je_, tc_)
    marker: str  # a symbol only this allocator defines (to recognise it in an executable)


ALLOCATORS = (
    Allocator("glibc", ("libc.so.", "libc-"), ("",), ""),
    Allocator("jemalloc", ("libjemalloc",), ("", "je_"), "je_malloc"),
    Allocator("tcmalloc", ("libtcmalloc",), ("", "tc_"), "tc_malloc"),
)


@dataclass(frozen=True, slots=True)
class Site:
    """One probed entry point of one mapped file in one process."""

    allocator: str
    func: str  # the entry point's name; aliases at one address joined: aligned_alloc/memalign
    program: str  # BPF entry program (how the size is passed)
    path: str  # the file, as the probing process can open it
    elf_addr: int  # the symbol's address in the ELF (what bcc's attach takes, with the skip)
    skip: int  # bytes moved past the function's start: 4 past endbr64, else 0
    addr: int  # where the probe sits in the process (what PT_REGS_IP reads at the probe)


class ElfFile:
    """The little of an ELF64 file that uprobes need: function symbols, loadable segments,
    code bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = path.read_bytes()
        if self.data[:4] != b"\x7fELF" or self.data[4] != 2 or self.data[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        phoff, shoff = struct.unpack_from("<QQ", self.data, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", self.data, 0x36)
        # PT_LOAD segments: (vaddr, file offset, size in file)
        self.loads = []
        for i in range(phnum):
            p_type, _flags, off, vaddr, _paddr, filesz = struct.unpack_from(
                "<IIQQQQ", self.data, phoff + i * phentsize
            )
            if p_type == 1:
                self.loads.append((vaddr, off, filesz))
        self.sections = [
            struct.unpack_from("<IIQQQQIIQQ", self.data, shoff + i * shentsize)
            for i in range(shnum)
        ]

    def functions(self, names: set[str]) -> dict[str, int]:
        """Defined function symbols among `names` -> their address (.dynsym and .symtab)."""
        return self.symbols(names, 2)  # STT_FUNC

    def symbols(self, names: set[str], stt: int) -> dict[str, int]:
        """Defined symbols of type `stt` among `names` -> their address."""
        wanted = {n.encode(): n for n in names}
        found: dict[str, int] = {}
        for _name, sh_type, _flags, _addr, off, size, link, _info, _align, entsize in self.sections:
            if sh_type not in (2, 11) or not entsize:  # SHT_SYMTAB, SHT_DYNSYM
                continue
            strtab_off = self.sections[link][4]
            for st_name, st_info, _other, shndx, value, _size in struct.iter_unpack(
                "<IBBHQQ", self.data[off : off + size]
            ):
                if st_info & 0xF != stt or shndx == 0 or not value:  # of that type, defined
                    continue
                end = self.data.index(b"\0", strtab_off + st_name)
                name = wanted.get(self.data[strtab_off + st_name : end])
                if name is not None:
                    found[name] = value
        return found

    def file_offset(self, vaddr: int) -> int:
        for seg_vaddr, seg_off, filesz in self.loads:
            if seg_vaddr <= vaddr < seg_vaddr + filesz:
                return vaddr - seg_vaddr + seg_off
        raise ValueError(f"{self.path}: address {vaddr:#x} is in no loadable segment")

    def entry_skip(self, vaddr: int) -> int:
        """4 when the function at vaddr starts with endbr64 (a CET build), else 0."""
        off = self.file_offset(vaddr)
        return len(ENDBR64) if self.data[off : off + len(ENDBR64)] == ENDBR64 else 0


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    offset: int
    size: int
    path: str


def file_mappings(paths: HostPaths, pid: int) -> dict[str, list[Mapping]]:
    """Executable file mappings of a process, by file path."""
    out: dict[str, list[Mapping]] = {}
    with open(paths.proc / str(pid) / "maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or "x" not in fields[1] or not fields[5].startswith("/"):
                continue
            path = fields[5].rstrip("\n")
            if path.endswith(" (deleted)"):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.setdefault(path, []).append(Mapping(lo, int(fields[2], 16), hi - lo, path))
    return out


def allocator_of(path: str, elf: ElfFile | None, is_exe: bool) -> Allocator | None:
    base = path.rsplit("/", 1)[-1]
    for alloc in ALLOCATORS:
        if any(base.startswith(p) for p in alloc.file_prefixes):
            return alloc
    if is_exe and elf is not None:
        markers = elf.functions({a.marker for a in ALLOCATORS if a.marker})
        for alloc in ALLOCATORS:
            if alloc.marker in markers:
                return alloc
    return None


def allocator_sites(pid: int, paths: HostPaths | None = None) -> list[Site]:
    """Every allocator entry point mapped into process `pid`, one Site per distinct address
    (aliases such as tcmalloc's malloc and tc_malloc share one)."""
    paths = paths or HostPaths()
    exe = (paths.proc / str(pid) / "exe").resolve()
    root = paths.proc / str(pid) / "root"
    sites: list[Site] = []
    for path, mappings in file_mappings(paths, pid).items():
        is_exe = Path(path) == exe
        if allocator_of(path, None, False) is None and not is_exe:
            continue
        local = root / path.lstrip("/")
        try:
            elf = ElfFile(local)
        except (OSError, ValueError):
            continue
        alloc = allocator_of(path, elf, is_exe)
        if alloc is not None:
            sites += _sites_in(alloc, elf, str(local), mappings)
    return sites


def _sites_in(alloc: Allocator, elf: ElfFile, local: str, mappings: list[Mapping]) -> list[Site]:
    wanted = {p + f: f for p in alloc.symbol_prefixes for f in ENTRY_POINTS}
    by_addr: dict[int, list[str]] = {}
    for sym, addr in elf.functions(set(wanted)).items():
        names = by_addr.setdefault(addr, [])
        if wanted[sym] not in names:
            names.append(wanted[sym])
    sites = []
    for elf_addr, names in sorted(by_addr.items()):
        names.sort(key=list(ENTRY_POINTS).index)
        skip = elf.entry_skip(elf_addr)
        off = elf.file_offset(elf_addr) + skip
        mapped = [m for m in mappings if m.offset <= off < m.offset + m.size]
        if not mapped:
            continue
        sites.append(
            Site(
                allocator=alloc.name,
                func="/".join(names),
                program=ENTRY_POINTS[names[0]],
                path=local,
                elf_addr=elf_addr,
                skip=skip,
                addr=mapped[0].start + off - mapped[0].offset,
            )
        )
    return sites
