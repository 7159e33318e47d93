"""Names for native instruction addresses in watched processes (python_stacks' samples of
threads with no Python frame): the function and its module, from bcc's symbol cache."""

from __future__ import annotations

import ctypes as ct
from collections.abc import Callable
from typing import Protocol

from gpujitter.probes.host import HostPaths
from gpujitter.probes.procfs import read_maps

UNKNOWN = "[unknown]"  # the function when the module is known but no symbol covers the address
REOPEN_NS = 1_000_000_000  # an address in no known module re-reads the maps at most this often
MAX_NAMES = 65_536  # (process, address) names kept; past it the cache starts afresh


class Symbols(Protocol):
    """One process's symbols: (function or None, module path or None) at an address."""

    def resolve(self, addr: int) -> tuple[str | None, str | None]: ...

    def close(self) -> None: ...


class BccSymbols:
    """bcc's symbol cache of one process (its maps as read when made; ELF symbols and debug
    files loaded per module on first use)."""

    def __init__(self, pid: int) -> None:
        from bcc import SymbolCache

        self._pid = pid
        self._cache = SymbolCache(pid)

    def resolve(self, addr: int) -> tuple[str | None, str | None]:
        name, _, module = self._cache.resolve(addr, True)
        return (
            name.decode(errors="replace") if name else None,
            module.decode(errors="replace") if module else None,
        )

    def close(self) -> None:
        from bcc.libbcc import lib

        lib.bcc_free_symcache(ct.c_void_p(self._cache.cache), self._pid)


def file_code(pid: int) -> list[tuple[int, int]]:
    """[start, end) of each stretch of code process pid maps from a file; [] when its maps
    cannot be read (it exited)."""
    try:
        return [(m.start, m.end) for m in read_maps(HostPaths(), pid) if m.file and m.executable]
    except OSError:
        return []


class NativeNames:
    """(function, module) of native addresses, per process, each found once. A symbol
    not found reads "[unknown]" in its module; an address in no module (a process that
    exited before its maps were read, JIT code) reads as its hex address with module ""."""

    def __init__(
        self,
        open_symbols: Callable[[int], Symbols] = BccSymbols,
        code_of: Callable[[int], list[tuple[int, int]]] = file_code,
    ) -> None:
        self._open = open_symbols
        self._code_of = code_of
        self._symbols: dict[int, tuple[Symbols | None, int]] = {}  # pid -> symbols, maps read
        self._names: dict[tuple[int, int], tuple[str, str]] = {}

    def name(self, pid: int, addr: int, now_ns: int) -> tuple[str, str]:
        """(function, module path) at addr in process pid."""
        known = self._names.get((pid, addr))
        if known is not None:
            return known
        func, module = self._resolve(pid, addr, now_ns, reopen=False)
        if module is None and self._loaded_since(pid, addr, now_ns):
            func, module = self._resolve(pid, addr, now_ns, reopen=True)
        if not module:  # not kept: a library loaded later is found at a later read of the maps
            return (f"{addr:#x}", "")
        if len(self._names) >= MAX_NAMES:
            self._names.clear()
        self._names[(pid, addr)] = (func or UNKNOWN, module)
        return self._names[(pid, addr)]

    def _loaded_since(self, pid: int, addr: int, now_ns: int) -> bool:
        """Whether addr lies in code mapped from a file since the symbols were made (a library
        loaded later), by the maps read at most once a REOPEN_NS. Only then are the symbols
        made again: that drops every library's symbol table loaded so far, and code in no
        file (JIT, trampolines) would do it each time, reloading libtorch's tables (hundreds
        of ms each) every second on a training job."""
        symbols, read_ns = self._symbols[pid]
        if now_ns - read_ns < REOPEN_NS:
            return False
        self._symbols[pid] = (symbols, now_ns)
        return any(start <= addr < end for start, end in self._code_of(pid))

    def _resolve(
        self, pid: int, addr: int, now_ns: int, reopen: bool
    ) -> tuple[str | None, str | None]:
        had = self._symbols.get(pid)
        if had is None or reopen:
            self._close(pid)
            try:
                had = (self._open(pid), now_ns)
            except (OSError, ImportError):
                had = (None, now_ns)
            self._symbols[pid] = had
        return had[0].resolve(addr) if had[0] is not None else (None, None)

    def forget(self, pid: int) -> None:
        """Drop what is known of process pid (it exited: its id may come back as another)."""
        self._close(pid)
        for key in [k for k in self._names if k[0] == pid]:
            del self._names[key]

    def _close(self, pid: int) -> None:
        had = self._symbols.pop(pid, None)
        if had is not None and had[0] is not None:
            had[0].close()

    def close(self) -> None:
        for pid in list(self._symbols):
            self.forget(pid)
