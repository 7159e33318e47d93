"""Where to put allocator uprobes in one process: which allocators /proc/PID/maps shows
(glibc, jemalloc, tcmalloc, or one linked into the executable), the entry points each
defines, and the address of each, moved past `endbr64` when the function starts with one
(a uprobe on endbr64 is single-stepped: ~6.5 us per hit instead of ~1.4 us at +4).

Symbols and code bytes come from the ELF files themselves (elf.py), opened through
/proc/PID/root so that containers work.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gpujitter.probes.elf import ElfFile
from gpujitter.probes.host import HostPaths
from gpujitter.probes.procfs import Mapping, in_root, read_maps

# How each entry point passes the size it allocates; the value names the BPF entry program
# (malloc_uprobes.bpf.c) that reads it. A uprobe-multi link's single entry program is told
# the same by its cookie: the program's index in SIZE_PROGRAMS.
SIZE_ARG1, SIZE_ARG2, SIZE_ARG3, CALLOC, NO_SIZE = (
    "enter_size1",
    "enter_size2",
    "enter_size3",
    "enter_calloc",
    "enter_nosize",
)
SIZE_PROGRAMS = (NO_SIZE, SIZE_ARG1, SIZE_ARG2, SIZE_ARG3, CALLOC)
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
    offset: int  # where the probe sits in the file (what a uprobe-multi link takes)
    addr: int  # where the probe sits in the process (what PT_REGS_IP reads at the probe)


def file_mappings(paths: HostPaths, pid: int) -> dict[str, list[Mapping]]:
    """Executable file mappings of a process, by file path; OSError when its maps cannot be
    read."""
    out: dict[str, list[Mapping]] = {}
    for m in read_maps(paths, pid):
        if m.executable and m.file:
            out.setdefault(m.path, []).append(m)
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
    # Where /proc/PID/exe points, as the process's maps name it: readlink, never resolve
    # (a deleted executable reads "<path> (deleted)", which its owner may make a link loop:
    # Path.resolve raises RuntimeError there).
    try:
        exe = Path(os.readlink(paths.proc / str(pid) / "exe"))
    except OSError:
        exe = None
    sites: list[Site] = []
    for path, mappings in file_mappings(paths, pid).items():
        is_exe = Path(path) == exe
        if allocator_of(path, None, False) is None and not is_exe:
            continue
        local = in_root(paths, pid, path)
        try:
            with ElfFile(local) as elf:
                alloc = allocator_of(path, elf, is_exe)
                if alloc is not None:
                    sites += _sites_in(alloc, elf, local, mappings)
        except (OSError, ValueError, IndexError, struct.error):  # not ELF, cut short, odd
            continue
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
        mapped = [m for m in mappings if m.holds(off)]
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
                offset=off,
                addr=mapped[0].address_of(off),
            )
        )
    return sites
