"""Where precise mode puts its uprobes: ELF symbols and the endbr64 skip, checked against
objdump on the real libc and on a CET-built program; allocators recognised in processes
that really map them (glibc, jemalloc and tcmalloc preloaded)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpujitter.probes.elf import ENDBR64, ElfFile
from gpujitter.probes.host import HostPaths
from gpujitter.probes.malloc_sites import (
    ENTRY_POINTS,
    Site,
    allocator_sites,
    file_mappings,
)
from tests.cet import FUNCTIONS, build_cet_program

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def first_instruction(path: Path, addr: int) -> str:
    """objdump's mnemonic for the instruction at `addr` (an independent decoder)."""
    out = subprocess.run(
        ["objdump", "-d", f"--start-address={addr:#x}", f"--stop-address={addr + 4:#x}", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(rf"^\s*{addr:x}:\t[0-9a-f ]+\t(\S+)", out, re.MULTILINE)
    assert m is not None, out
    return m.group(1)


def libc_path() -> Path:
    """The libc this test runs on."""
    return Path(next(p for p in file_mappings(HostPaths(), os.getpid()) if "/libc.so." in p))


def test_libc_entry_points_are_moved_only_past_a_real_endbr64() -> None:
    libc = libc_path()
    elf = ElfFile(libc)
    symbols = elf.functions(set(ENTRY_POINTS))
    assert set(symbols) == set(ENTRY_POINTS)  # glibc defines all of them
    for name, addr in symbols.items():
        off = elf.file_offset(addr)
        starts_with_endbr = libc.read_bytes()[off : off + 4] == ENDBR64
        assert (first_instruction(libc, addr) == "endbr64") == starts_with_endbr, name
        assert elf.entry_skip(addr) == (4 if starts_with_endbr else 0), name


def test_cet_built_functions_are_moved_past_endbr64(tmp_path: Path) -> None:
    exe = build_cet_program(tmp_path)
    elf = ElfFile(exe)
    symbols = elf.functions(set(FUNCTIONS))
    assert set(symbols) == set(FUNCTIONS)
    for name, addr in symbols.items():
        assert first_instruction(exe, addr) == "endbr64", name
        assert elf.entry_skip(addr) == 4, name


def test_non_elf_files_are_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a program\n")
    with pytest.raises(ValueError, match="not a 64-bit"):
        ElfFile(text)


@contextmanager
def process(preload: str | None = None) -> Iterator[int]:
    env = {"LD_PRELOAD": preload} if preload else {}
    # It says so once the interpreter runs: every library it needs is mapped by then (a
    # count of mappings was reached half-way through the loader's work on a busy machine).
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def by_allocator(sites: list[Site]) -> dict[str, dict[str, Site]]:
    out: dict[str, dict[str, Site]] = {}
    for s in sites:
        out.setdefault(s.allocator, {})[s.func] = s
    return out


def test_a_plain_process_gets_glibcs_entry_points_at_their_mapped_addresses() -> None:
    with process() as pid:
        sites = allocator_sites(pid)
        maps = file_mappings(HostPaths(), pid)
    glibc = by_allocator(sites)["glibc"]
    # aligned_alloc and memalign are one function in glibc: one probe, both names.
    assert set(glibc) == {
        "malloc",
        "calloc",
        "realloc",
        "free",
        "posix_memalign",
        "aligned_alloc/memalign",
    }
    for site in glibc.values():
        mapped = [m for m in maps[site.path.split("/root", 1)[1]] if m.start <= site.addr]
        assert any(site.addr < m.start + m.size for m in mapped)
    assert glibc["calloc"].program == "enter_calloc"
    assert glibc["posix_memalign"].program == "enter_size3"


def test_preloaded_jemalloc_and_tcmalloc_are_recognised() -> None:
    with process(JEMALLOC) as pid:
        jemalloc = by_allocator(allocator_sites(pid))
    assert set(jemalloc) == {"glibc", "jemalloc"}
    assert {"malloc", "calloc", "free"} <= set(jemalloc["jemalloc"])
    with process(TCMALLOC) as pid:
        tcmalloc = by_allocator(allocator_sites(pid))
    # malloc and tc_malloc are one address: probed once, under the standard name.
    assert "malloc" in tcmalloc["tcmalloc"]
    addrs = [s.addr for s in tcmalloc["tcmalloc"].values()]
    assert len(addrs) == len(set(addrs))
    assert all(s.allocator == "tcmalloc" for s in tcmalloc["tcmalloc"].values())
