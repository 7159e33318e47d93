"""Naming native addresses (probes/native_names.py): the symbols of a live process, and the
fallbacks: an address no symbol covers, one in no module, a process gone, a library loaded
after the maps were read, a symbol cache that cannot be made; and that naming closes no
descriptor but its own (bcc's symbol cache, used before, did). A file's functions: nested,
overlapping, aliased and zero-size ones, C++ names demangled, a large table kept
compactly, and corrupt files named "[unknown]" without an exception."""

from __future__ import annotations

import ctypes
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

from bench.synthetic_elf import mangled, write_elf
from gpujitter.probes.host import HostPaths
from gpujitter.probes.native_names import (
    REOPEN_NS,
    UNKNOWN,
    FileFunctions,
    Functions,
    NativeNames,
    ProcessSymbols,
)


class FakeSymbols:
    """A process's symbols as a table: address -> (function or None, module or None)."""

    def __init__(self, table: dict[int, tuple[str | None, str | None]], opened: list[int]):
        self.table, self.closed = table, False
        opened.append(1)

    def resolve(self, addr: int) -> tuple[str | None, str | None]:
        return self.table.get(addr, (None, None))

    def close(self) -> None:
        self.closed = True


def _names(
    tables: list[dict[int, tuple[str | None, str | None]]],
    code: list[tuple[int, int]] | None = None,
) -> tuple[NativeNames, list]:
    """NativeNames whose n-th symbol cache made holds tables[n] (the last one from then on),
    in a process whose maps hold code from files at `code` ([start, end) each)."""
    opened: list[int] = []
    made: list[FakeSymbols] = []

    def open_symbols(pid: int, _files: FileFunctions) -> FakeSymbols:
        made.append(FakeSymbols(tables[min(len(opened), len(tables) - 1)], opened))
        return made[-1]

    return NativeNames(open_symbols, lambda pid: code or []), made


def test_a_symbol_is_named_with_its_module_once_per_address() -> None:
    names, made = _names([{0x1000: ("memcpy", "/lib/libc.so.6")}])
    assert names.name(7, 0x1000, 0) == ("memcpy", "/lib/libc.so.6")
    assert names.name(7, 0x1000, 5 * REOPEN_NS) == ("memcpy", "/lib/libc.so.6")
    assert len(made) == 1


def test_an_address_no_symbol_covers_is_unknown_in_its_module() -> None:
    names, _ = _names([{0x2000: (None, "/lib/libcrypto.so.3")}])
    assert names.name(7, 0x2000, 0) == (UNKNOWN, "/lib/libcrypto.so.3")


def test_an_address_in_no_module_reads_the_maps_again_at_most_once_a_second() -> None:
    # A library loaded after the maps were read: its address is the hex one until the maps
    # are read again (not sooner than REOPEN_NS after the last read), then its function.
    names, made = _names([{}, {0x3000: ("late_fn", "/opt/late.so")}], code=[(0x3000, 0x4000)])
    assert names.name(7, 0x3000, 0) == ("0x3000", "")
    assert names.name(7, 0x3000, REOPEN_NS // 2) == ("0x3000", "")
    assert len(made) == 1
    assert names.name(7, 0x3000, REOPEN_NS) == ("late_fn", "/opt/late.so")
    assert len(made) == 2 and made[0].closed
    names.forget(7)
    assert made[1].closed


def test_code_in_no_file_never_makes_the_symbols_again() -> None:
    # JIT code or a trampoline sampled every 10 ms for 10 s, beside a library's symbol: the
    # symbols are made once. Made again each second, they dropped every loaded symbol table
    # (a training job's daemon spent 27 % of a CPU reloading libtorch's).
    names, made = _names([{0x1000: ("memcpy", "/lib/libc.so.6")}], code=[(0x1000, 0x2000)])
    for i in range(1000):
        assert names.name(7, 0x9000 + i % 2, i * REOPEN_NS // 100) == (f"{0x9000 + i % 2:#x}", "")
    assert names.name(7, 0x1000, 10 * REOPEN_NS) == ("memcpy", "/lib/libc.so.6")
    assert len(made) == 1


def test_a_symbol_cache_that_cannot_be_made_gives_hex_addresses() -> None:
    def refuse(pid: int, _files: FileFunctions) -> FakeSymbols:
        raise OSError("no such process")

    names = NativeNames(refuse)
    assert names.name(7, 0xABC, 0) == ("0xabc", "")
    names.close()


def test_names_a_libc_function_of_a_live_process_and_hex_for_a_gone_one() -> None:
    libc = ctypes.CDLL("libc.so.6")
    addr = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    assert addr is not None
    names = NativeNames()
    func, module = names.name(os.getpid(), addr, 0)
    assert "getpid" in func and os.path.basename(module).startswith("libc"), (func, module)
    assert names.name(os.getpid(), 0x10, 0) == ("0x10", "")  # in no module
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert names.name(gone.pid, addr + 1, REOPEN_NS) == (f"{addr + 1:#x}", "")
    names.close()


# A child that names an address of a zombie (its maps read empty, its root link gone) after
# laying freed heap blocks of the size of bcc 0.26's ModulePath filled with the number of a
# descriptor it holds: that symbol cache read the number uninitialised and closed it (an
# arbitrary number in the daemon: whatever descriptor held it, once pytest's capture file).
NAMING = """
import ctypes, os, subprocess, time
from gpujitter.probes.native_names import NativeNames

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
exited = subprocess.Popen(["true"])  # not waited for
while open(f"/proc/{exited.pid}/stat").read().split(") ")[1][0] != "Z":
    time.sleep(0.01)
names = NativeNames()
names.name(os.getpid(), 0x10, 0)  # its imports done before the heap is laid
kept = os.open(os.devnull, os.O_RDONLY)
blocks = [libc.malloc(88) for _ in range(300)]
for block in blocks:
    ctypes.memmove(block, (ctypes.c_int * 22)(*[kept] * 22), 88)
for block in blocks:
    libc.free(block)
names.name(exited.pid, 0x1000, 0)
os.fstat(kept)
exited.wait()
print("kept")
"""


def test_naming_an_exited_process_closes_no_descriptor_it_did_not_open() -> None:
    run = subprocess.run([sys.executable, "-c", NAMING], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert run.stdout.strip() == "kept", run.stdout + run.stderr


def _functions(tmp_path: Path, symbols: list[tuple[int, int, str]], **kw: int) -> Functions:
    """Functions.of a file whose one symbol table holds `symbols` (address, size, name); the
    file maps from address 0, so an address is its file offset."""
    return Functions.of(str(write_elf(tmp_path / "lib.so", symbols, **kw)))


def test_an_address_past_a_nested_function_is_named_by_the_outer_one(tmp_path: Path) -> None:
    # A function inside another's span (a local label with a size, a nested helper): the
    # inner one where it lies, the outer one before and after it, not "no function".
    funcs = _functions(tmp_path, [(0x1000, 0x100, "outer"), (0x1040, 0x20, "inner"),
                                  (0x1050, 0x8, "innermost")])  # fmt: skip
    assert [funcs.at(a) for a in (0x1000, 0x1044, 0x1052, 0x1059, 0x1070, 0x10FF)] == [
        "outer", "inner", "innermost", "inner", "outer", "outer"]  # fmt: skip


def test_functions_that_overlap_without_nesting_name_the_later_one(tmp_path: Path) -> None:
    funcs = _functions(tmp_path, [(0x1000, 0x30, "first"), (0x1010, 0x30, "second")])
    assert [funcs.at(a) for a in (0x100F, 0x1010, 0x102F, 0x1030, 0x103F)] == [
        "first", "second", "second", "second", "second"]  # fmt: skip


def test_aliases_of_one_span_read_as_the_shortest_name_whatever_the_order(
    tmp_path: Path,
) -> None:
    for order in (["__getpid", "getpid", "__GI_getpid"], ["__GI_getpid", "getpid", "__getpid"]):
        funcs = _functions(tmp_path, [(0x2000, 0x10, name) for name in order])
        assert funcs.at(0x2008) == "getpid"
    # A wider alias starting at the same address covers the narrower one's end.
    funcs = _functions(tmp_path, [(0x2000, 0x10, "narrow"), (0x2000, 0x40, "wide")])
    assert (funcs.at(0x2004), funcs.at(0x2030)) == ("narrow", "wide")


def test_zero_size_symbols_and_addresses_outside_every_function_have_no_name(
    tmp_path: Path,
) -> None:
    funcs = _functions(tmp_path, [(0x1000, 0, "marker"), (0x3000, 0x10, "last"),
                                  (0x3000, 0, "label_at_last")])  # fmt: skip
    assert [funcs.at(a) for a in (0x0FFF, 0x1000, 0x1001, 0x2FFF, 0x3008, 0x3010, 1 << 39)] == [
        None, None, None, None, "last", None, None]  # fmt: skip


def test_a_mangled_cxx_function_is_named_as_its_source_spells_it(tmp_path: Path) -> None:
    funcs = _functions(tmp_path, [(0x1000, 0x10, mangled(7)), (0x1010, 0x10, "_Znot_mangled")])
    assert funcs.at(0x1000) == (
        "at::native::add_kernel_7(at::TensorIteratorBase&, c10::Scalar const&)"
    )
    assert funcs.at(0x1010) == "_Znot_mangled"


def test_one_file_seen_through_two_paths_is_read_once(tmp_path: Path) -> None:
    # A job and its DataLoader workers map the same libraries, each named through its own
    # /proc/PID/root: the key was the path, so each process read libtorch's table again.
    lib = write_elf(tmp_path / "libone.so", [(0x1000, 0x40, "gj_named")])
    (tmp_path / "via").symlink_to(tmp_path)
    files = FileFunctions()
    first = files.of(str(lib))
    assert files.of(str(tmp_path / "via" / "libone.so")) is first
    assert first.at(0x1010) == "gj_named"
    files.close()


def test_names_close_every_descriptor_they_opened(tmp_path: Path) -> None:
    # The files' descriptors go with the NativeNames that read them (the probe's close),
    # not with a process-wide cache that outlives it.
    before = set(os.listdir("/proc/self/fd"))
    libc = ctypes.CDLL("libc.so.6")
    addr = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    names = NativeNames()
    assert "getpid" in names.name(os.getpid(), addr, 0)[0]
    assert set(os.listdir("/proc/self/fd")) - before
    names.close()
    assert set(os.listdir("/proc/self/fd")) <= before


# Reads a library's functions, then cuts the file short in place (as the user who owns a
# watched process's library may) and names an address: no name, in a process that lives on
# (a read of a mapped page past a file's end is SIGBUS, which is why names are pread).
CUT_SHORT = """
import sys
from gpujitter.probes.native_names import Functions
funcs = Functions.of(sys.argv[1])
assert funcs.at(int(sys.argv[2], 16)) == "gj_named"
with open(sys.argv[1], "r+b") as f:
    f.truncate(64)
print(funcs.at(int(sys.argv[2], 16)))
"""


def test_a_library_cut_short_after_its_table_was_read_gives_no_name(tmp_path: Path) -> None:
    lib = write_elf(tmp_path / "libcut.so", [(0x1000, 0x40, "gj_named")])
    done = subprocess.run([sys.executable, "-c", CUT_SHORT, str(lib), "0x1010"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


# A child's resident memory before and after reading a file of 100k C++ functions (a third of
# libtorch_cpu's): kept as a tuple and a str each, they took ~260 bytes a function.
KEPT = """
import sys
from gpujitter.probes.native_names import Functions
def anon_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1])
before = anon_kib()
funcs = Functions.of(sys.argv[1])
print(len(funcs.starts), (anon_kib() - before) // 1024)
"""


def test_a_large_symbol_table_is_kept_in_tens_of_bytes_a_function(tmp_path: Path) -> None:
    big = write_elf(tmp_path / "libbig.so", ((0x10000 + 64 * i, 48, mangled(i))
                                             for i in range(100_000)))  # fmt: skip
    out = subprocess.run([sys.executable, "-c", KEPT, str(big)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    functions, grew_mb = (int(x) for x in out.stdout.split())
    assert functions == 100_000
    assert grew_mb < 12, grew_mb  # ~29 bytes a function kept: 3 MB; tuples and strs: 30 MB


def _proc_tree(tmp_path: Path, files: list[bytes]) -> Path:
    """A recorded /proc where process 7 maps code from /lib/libN.so for each of `files`
    (its content), 16 pages each from 0x100000 * (N + 1)."""
    proc = tmp_path / "proc" / "7"
    (proc / "root" / "lib").mkdir(parents=True)
    lines = []
    for n, content in enumerate(files):
        (proc / "root" / "lib" / f"lib{n}.so").write_bytes(content)
        start = 0x100000 * (n + 1)
        lines.append(f"{start:x}-{start + 0x10000:x} r-xp 00000000 08:01 {n + 1} /lib/lib{n}.so")
    (proc / "maps").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_corrupt_or_truncated_libraries_give_unknown_never_an_exception(tmp_path: Path) -> None:
    # Any user's process can map any file: libz cut short or with bytes changed (headers,
    # section table, symbol table), many times over, is named without an exception, in its
    # module; cut short before its symbols, it reads "[unknown]".
    libz = Path("/usr/lib/x86_64-linux-gnu/libz.so.1").read_bytes()
    rng = random.Random(14)
    shoff = struct.unpack_from("<Q", libz, 0x28)[0]
    files = [libz[: rng.randrange(0, len(libz))] for _ in range(40)]
    for _ in range(360):
        mutant = bytearray(libz)
        for _ in range(rng.randrange(1, 9)):
            where = rng.choice((rng.randrange(0, 64), rng.randrange(shoff, len(libz)),
                                rng.randrange(0, 0x4000), rng.randrange(0, len(libz))))  # fmt: skip
            mutant[where] = rng.randrange(256)
        files.append(bytes(mutant))
    paths = HostPaths.under(_proc_tree(tmp_path, files))
    names = NativeNames(lambda pid, files: ProcessSymbols(pid, files, paths))
    for n, content in enumerate(files):
        addr = 0x100000 * (n + 1) + rng.randrange(0, 0x10000)
        func, module = names.name(7, addr, 0)
        assert module == f"/lib/lib{n}.so"
        if len(content) < 0x1000:
            assert func == UNKNOWN
    names.close()


def test_a_symbol_table_pointing_outside_the_file_gives_unknown(tmp_path: Path) -> None:
    # Each way a header of the one symbol table of a generated library can point past the
    # file: its string table's index (sh_link), its own offset, a name's offset in the
    # string table, the string table's offset, its own size (what lies inside is read).
    good = write_elf(tmp_path / "good.so", [(0x1000, 0x100, "spin")]).read_bytes()
    table_header = struct.unpack_from("<Q", good, 0x28)[0] + 2 * 64  # section 2's header
    names_header = table_header + 64
    first_symbol = struct.unpack_from("<Q", good, table_header + 24)[0] + 24

    def patched(at: int, fmt: str, value: int) -> bytes:
        out = bytearray(good)
        struct.pack_into(fmt, out, at, value)
        return bytes(out)

    files = [
        good,
        patched(table_header + 40, "<I", 99),  # sh_link: no such section
        patched(table_header + 24, "<Q", len(good) + 4096),  # the table past the end
        patched(first_symbol, "<I", 0xFFFF_FFF0),  # the name past its string table
        patched(names_header + 24, "<Q", 1 << 62),  # the string table past the end
        patched(table_header + 32, "<Q", 1 << 62),  # the table running past the end
    ]
    paths = HostPaths.under(_proc_tree(tmp_path, files))
    names = NativeNames(lambda pid, files: ProcessSymbols(pid, files, paths))
    got = [names.name(7, 0x100000 * (n + 1) + 0x1010, 0)[0] for n in range(len(files))]
    assert got == ["spin", UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, "spin"]
    names.close()
