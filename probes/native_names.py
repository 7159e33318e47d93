"""Names for native instruction addresses in watched processes (python_stacks' samples of
threads with no Python frame): the function and its module, from the process's maps and the
mapped files' own symbol tables."""

from __future__ import annotations

import bisect
import os
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpujitter.probes.base import trim_heap
from gpujitter.probes.demangle import demangle
from gpujitter.probes.elf import ElfFile
from gpujitter.probes.host import HostPaths
from gpujitter.probes.procfs import in_root, read_maps

UNKNOWN = "[unknown]"  # the function when the module is known but no symbol covers the address
REOPEN_NS = 1_000_000_000  # an address in no known module re-reads the maps at most this often
MAX_NAMES = 65_536  # (process, address) names kept; past it the cache starts afresh
FILES_KEPT = 16  # files whose functions are kept (read again when they change)
DEBUG_FILES = Path("/usr/lib/debug/.build-id")  # separate debug files, by build id
_WIDEST = (1 << 64) - 1  # the largest end: keys hold (_WIDEST - end), the wider span first
_INDEX = (1 << 31) - 1  # a function's index in its file's entries, in a sort key
NAME_CHUNK = 256  # bytes read at a time for a name (most C++ names fit; longer ones loop)
MAX_NAME = 65_536  # a name longer than this (no NUL found) is not a name


class Symbols(Protocol):
    """One process's symbols: (function or None, module path or None) at an address."""

    def resolve(self, addr: int) -> tuple[str | None, str | None]: ...

    def close(self) -> None: ...


class NameFile:
    """A kept file's names, read with pread at their offsets: a file cut short or rewritten
    in place since (by the user who runs the watched process) reads as no name, where a
    page of a mapping past the file's new end would kill the daemon with SIGBUS."""

    __slots__ = ("_fd",)

    def __init__(self, path: str | Path) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    @property
    def proc_path(self) -> str:
        """A path to this very file (whatever is at its own path now)."""
        return f"/proc/self/fd/{self._fd}"

    def name_at(self, offset: int) -> str | None:
        """The NUL-ended name that starts at `offset`, None if the file ends first."""
        name = b""
        while len(name) < MAX_NAME:
            try:
                chunk = os.pread(self._fd, NAME_CHUNK, offset + len(name))
            except OSError:
                return None
            end = chunk.find(b"\0")
            if end >= 0:
                return (name + chunk[:end]).decode(errors="replace")
            if len(chunk) < NAME_CHUNK:
                return None
            name += chunk
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # a Functions dropped by the cache takes its files with it
        self.close()


@dataclass(frozen=True, slots=True)
class Functions:
    """One file's functions, kept as arrays (29 bytes a function; a tuple and a str each took
    ~260, ~95 MB for libtorch_cpu's 300k), their names left in the files and read only for
    an address a sample hits. `loads`: where the file's loadable segments lie
    (vaddr, file offset, size); starts, ends: each function's span, sorted by start, a wider
    span first where two start together; outer: the index of the nearest earlier function
    still open at its start (-1: none), so that an address past a function nested in
    another is named by the outer one; names: where the name lies in files[source]."""

    loads: tuple[tuple[int, int, int], ...]
    starts: array[int]
    ends: array[int]
    outer: array[int]
    names: array[int]
    sources: array[int]
    files: tuple[NameFile, ...]

    @classmethod
    def of(cls, path: str) -> Functions:
        """The functions of the ELF file at `path`, its separate debug file's added (where
        the distribution stripped the file's own table); OSError, ValueError if unreadable."""
        # Each file is read through a descriptor kept for its names, so that the names come
        # from the file the table was read from, even where it is replaced since (an
        # upgrade): the processes that map it keep its old contents too.
        files = [NameFile(path)]
        with ElfFile(files[0].proc_path) as elf:
            loads, build_id = tuple(elf.loads), elf.build_id()
            entries = [elf.function_entries()]
        debug = DEBUG_FILES / build_id[:2] / f"{build_id[2:]}.debug" if build_id else None
        if debug is not None and debug.is_file():
            files.append(NameFile(debug))
            with ElfFile(files[1].proc_path) as extra:
                entries.append(extra.function_entries())
        functions = cls._sorted(loads, entries, tuple(files))
        trim_heap()  # the entries and the sort's keys (~75 bytes a function) are freed now
        return functions

    @classmethod
    def _sorted(
        cls,
        loads: tuple[tuple[int, int, int], ...],
        entries: list[tuple[array[int], array[int], array[int]]],
        files: tuple[NameFile, ...],
    ) -> Functions:
        """The entries of each file (function_entries) in one table ordered by start, then
        the wider first. One integer key per function, so that sorting 300k of them makes
        no tuple each."""
        keys = [
            (start << 64 | (_WIDEST - end)) << 32 | source << 31 | i
            for source, (starts, ends, _names) in enumerate(entries)
            for i, (start, end) in enumerate(zip(starts, ends, strict=True))
        ]
        keys.sort()
        starts, ends, names, sources = array("Q"), array("Q"), array("Q"), array("B")
        # open_: the spans that hold the start reached, each inside or across the one below
        outer, open_ = array("i"), list[int]()
        for key in keys:
            source, i = key >> 31 & 1, key & _INDEX
            start = key >> 96
            while open_ and ends[open_[-1]] <= start:
                open_.pop()
            outer.append(open_[-1] if open_ else -1)
            open_.append(len(starts))
            starts.append(start)
            ends.append(entries[source][1][i])
            names.append(entries[source][2][i])
            sources.append(source)
        return cls(loads, starts, ends, outer, names, sources, files)

    def at(self, file_offset: int) -> str | None:
        """The function whose code holds the byte at `file_offset`, demangled; None if none
        (or its name cannot be read). Of nested functions, the innermost; of aliases (one
        span, several names), the shortest name, then the first in byte order (getpid, not
        __getpid)."""
        vaddr = next((file_offset - offset + start for start, offset, size in self.loads
                      if offset <= file_offset < offset + size), None)  # fmt: skip
        if vaddr is None:
            return None
        i = bisect.bisect_right(self.starts, vaddr) - 1
        while i >= 0 and self.ends[i] <= vaddr:
            i = self.outer[i]
        if i < 0:
            return None
        first, span = i, (self.starts[i], self.ends[i])
        while first > 0 and (self.starts[first - 1], self.ends[first - 1]) == span:
            first -= 1
        last = i
        while last + 1 < len(self.starts) and (self.starts[last + 1], self.ends[last + 1]) == span:
            last += 1
        names = [self.files[self.sources[j]].name_at(self.names[j]) for j in range(first, last + 1)]
        known = [n for n in names if n]
        return demangle(min(known, key=lambda n: (len(n), n))) if known else None

    def close(self) -> None:
        for f in self.files:
            f.close()


class FileFunctions:
    """The functions of the files a NativeNames has read, kept by the file's identity
    (device, inode, modification time), not its path: the processes of one program (a
    training job and its DataLoader workers, each seen through its own /proc/PID/root) and
    one process's maps read again share one read (libc's 7,400 functions take ~35 ms,
    libtorch's hundreds of thousands seconds). At most FILES_KEPT, the least recently used
    dropped first (its descriptors close once no process's symbols hold it)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[int, int, int], Functions] = OrderedDict()

    def of(self, path: str) -> Functions:
        """The functions of the file at `path`; OSError, ValueError if unreadable."""
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        functions = self._kept.get(key)
        if functions is None:
            functions = self._kept[key] = Functions.of(path)
            while len(self._kept) > FILES_KEPT:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        return functions

    def close(self) -> None:
        for functions in self._kept.values():
            functions.close()
        self._kept.clear()


class ProcessSymbols:
    """One process's symbols: its executable file mappings as /proc/<pid>/maps listed them
    when made, each file's functions read on first use (through the process's root, so a
    process in a container is read in its own files) and kept in `files`. It opens and
    closes only descriptors of its own: bcc 0.26's symbol cache, used here before, closes
    an uninitialised number each time it is made for a process whose root link cannot be
    read (one that exited, or a zombie), which took whatever descriptor of this process
    held that number."""

    def __init__(self, pid: int, files: FileFunctions, paths: HostPaths | None = None) -> None:
        self._pid, self._files, self._paths = pid, files, paths or HostPaths()
        self._code = [m for m in read_maps(self._paths, pid) if m.file and m.executable]
        self._read: dict[str, Functions | None] = {}

    def resolve(self, addr: int) -> tuple[str | None, str | None]:
        for m in self._code:
            if m.start <= addr < m.end:
                if m.path not in self._read:
                    try:
                        self._read[m.path] = self._files.of(in_root(self._paths, self._pid, m.path))
                    except (OSError, ValueError):  # gone, unreadable, not ELF: the module only
                        self._read[m.path] = None
                functions = self._read[m.path]
                return (functions.at(addr - m.start + m.offset) if functions else None), m.path
        return None, None

    def close(self) -> None:
        self._read.clear()


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
        open_symbols: Callable[[int, FileFunctions], Symbols] = ProcessSymbols,
        code_of: Callable[[int], list[tuple[int, int]]] = file_code,
    ) -> None:
        self._open = open_symbols
        self._code_of = code_of
        self.files = FileFunctions()  # the files' functions, shared by the processes
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
                had = (self._open(pid, self.files), now_ns)
            except (OSError, ValueError):
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
        self.files.close()
