"""The one ELF reader against binutils on real files: exported functions as readelf lists
them, every symbol table for the probes that look inside (.symtab too), sections by name,
code bytes at an address, and files that are not ELF or are cut short refused with one line."""

from __future__ import annotations

import os
import random
import re
import struct
import subprocess
from pathlib import Path

import pytest

from gpujitter.probes.elf import STT_FUNC, STT_OBJECT, ElfFile

LIBZ = Path("/usr/lib/x86_64-linux-gnu/libz.so.1")
PYTHON = Path(os.path.realpath("/usr/bin/python3.11"))  # Debian's: not stripped


def readelf_symbols(path: Path, dynamic: bool) -> dict[str, tuple[int, str, str, str]]:
    """name -> (value, type, binding, section index) as readelf prints them."""
    out = subprocess.run(
        ["readelf", "-W", "--dyn-syms" if dynamic else "--syms", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = {}
    for line in out.splitlines():
        m = re.match(
            r"\s*\d+: ([0-9a-f]+)\s+(?:0x)?[0-9a-f]+ (\w+)\s+(\w+)\s+\w+\s+(\w+) (\S+)", line
        )
        if m:
            found[m.group(5).split("@")[0]] = (
                int(m.group(1), 16), m.group(2), m.group(3), m.group(4)
            )  # fmt: skip
    return found


def test_exported_functions_are_readelfs() -> None:
    expected = {
        name: value
        for name, (value, kind, bind, ndx) in readelf_symbols(LIBZ, dynamic=True).items()
        if kind == "FUNC" and bind in ("GLOBAL", "WEAK") and ndx != "UND"
    }
    with ElfFile(LIBZ) as elf:
        assert elf.exported_functions() == expected
        assert "deflate" in expected


def test_symbols_of_a_type_come_from_both_tables() -> None:
    symtab = readelf_symbols(PYTHON, dynamic=False)
    if "_PyRuntime" not in symtab:
        pytest.fail(f"{PYTHON} has no _PyRuntime symbol")
    with ElfFile(PYTHON) as elf:
        found = elf.symbols({"_PyRuntime", "PyCode_Type", "Py_Initialize", "no_such"}, STT_OBJECT)
        assert found == {n: symtab[n][0] for n in ("_PyRuntime", "PyCode_Type")}
        assert elf.functions({"Py_Initialize"}) == {"Py_Initialize": symtab["Py_Initialize"][0]}
        assert elf.symbols({"Py_Initialize"}, STT_FUNC) == elf.functions({"Py_Initialize"})


def test_sections_and_code_bytes_are_objdumps() -> None:
    with ElfFile(LIBZ) as elf:
        text = elf.section(".text")
        assert text is not None and elf.section(".no_such") is None
        addr = elf.exported_functions()["deflate"]
        assert text[3] <= addr < text[3] + text[5]
        dump = subprocess.run(
            ["objdump", "-d", f"--start-address={addr:#x}", f"--stop-address={addr + 4:#x}",
             str(LIBZ)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        m = re.search(rf"^\s*{addr:x}:\t([0-9a-f ]+)\t", dump, re.MULTILINE)
        assert m is not None, dump
        head = bytes.fromhex(m.group(1).replace(" ", ""))
        assert elf.code(addr, len(head)) == head
        assert elf.entry_skip(addr) == (4 if head[:4] == bytes.fromhex("f30f1efa") else 0)
        with pytest.raises(ValueError, match="no loadable segment"):
            elf.file_offset(1 << 60)


def test_what_is_not_elf_is_refused(tmp_path: Path) -> None:
    empty, text = tmp_path / "empty.so", tmp_path / "notes.txt"
    empty.write_bytes(b"")
    text.write_text("not a program, but longer than an ELF header would be: " * 2)
    for path in (empty, text):
        with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
            ElfFile(path)


def test_what_is_no_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO named as a library (`--libcuda`, a mapping's path in a recorded tree) was
    opened for reading: the open waited for a writer for ever."""
    fifo = tmp_path / "libcuda.so.1"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, Path("/dev/zero")):
        with pytest.raises(ValueError, match="not a regular file"):
            ElfFile(path)


def test_a_file_cut_short_is_refused_not_misread(tmp_path: Path) -> None:
    cut = tmp_path / "libcut.so"
    cut.write_bytes(LIBZ.read_bytes()[:4096])  # headers, but no section table
    with pytest.raises((ValueError, IndexError, struct.error)), ElfFile(cut) as elf:
        elf.exported_functions()


def test_symbols_of_a_corrupt_file_are_what_lies_inside_or_a_one_line_refusal(
    tmp_path: Path,
) -> None:
    # Any process can map any file, and the probes look up symbols of what watched processes
    # map (libpython's _PyRuntime, libcuda's entry points): libz cut short or with bytes
    # changed in its headers and tables gives the symbols that lie inside the file or a
    # ValueError, never an IndexError or a struct.error from past its end.
    libz = LIBZ.read_bytes()
    rng = random.Random(15)
    shoff = struct.unpack_from("<Q", libz, 0x28)[0]
    refused = 0
    for n in range(300):
        mutant = bytearray(libz[: rng.randrange(64, len(libz))] if n % 5 == 0 else libz)
        for _ in range(rng.randrange(1, 9)):
            where = rng.choice((rng.randrange(0, 64), rng.randrange(shoff, len(libz)),
                                rng.randrange(0, len(libz))))  # fmt: skip
            if where < len(mutant):
                mutant[where] = rng.randrange(256)
        path = tmp_path / f"lib{n}.so"
        path.write_bytes(mutant)
        try:
            with ElfFile(path) as elf:
                elf.exported_functions()
                elf.functions({"inflate", "no_such"})
                elf.symbols(None, STT_OBJECT)
        except ValueError:
            refused += 1
    assert 0 < refused < 300
