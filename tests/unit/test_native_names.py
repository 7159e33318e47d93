"""Naming native addresses (probes/native_names.py): the symbols of a live process, and the
fallbacks: an address no symbol covers, one in no module, a process gone, a library loaded
after the maps were read, a symbol cache that cannot be made; and that naming closes no
descriptor but its own (bcc's symbol cache, used before, did)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

from gpujitter.probes.native_names import REOPEN_NS, UNKNOWN, NativeNames


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

    def open_symbols(pid: int) -> FakeSymbols:
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
    def refuse(pid: int) -> FakeSymbols:
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
