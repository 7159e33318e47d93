"""A running CPython seen from outside the process, with process_vm_readv: where its version
keeps the fields a stack walk needs, its threads' states, and a code object's function, file
and first line. python_stacks walks the frames in the kernel (python_stacks.bpf.c) with this
layout and turns the code objects it streams into text here; Interpreter.stack is the same
walk from user space, which the unit tests hold every layout to against live processes.

How: the interpreter's `_PyRuntime` symbol (in the `python3.X` executable or the
`libpython3.X.so` it maps) leads to the interpreter state, its thread states (matched to
kernel thread ids) and each thread's current frame; frames lead to code objects, whose name
and file are unicode objects. Where the fields sit depends on the version: 3.10-3.12 from
the table LAYOUTS (offsetof() over each version's headers; tests/unit/test_pyframes.py
compiles the same against every interpreter's headers it finds and compares), 3.13 from the
_Py_DebugOffsets the runtime itself carries at the start of `_PyRuntime`. Another version,
or a build whose layout differs (free-threaded, debug), is refused with one line why.
Nothing is written into the process and nothing stops it; a read that races the
interpreter (a frame freed under it) fails or yields a frame the code-object check rejects,
and that sample is dropped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from gpujitter.probes.elf import STT_OBJECT, ElfFile
from gpujitter.probes.host import HostPaths
from gpujitter.probes.procfs import in_root, read_maps
from gpujitter.text import jsonable

_VERSION = re.compile(r"^(?:lib)?python(3)\.(\d+)")
DEBUG_COOKIE = b"xdebugpy"
OWNED_BY_CSTACK = 3  # a shim frame of 3.12+ (the C stack owns it): not Python code
MAX_DEPTH = 64  # frames walked per thread: a cycle read out of a racing frame ends here
CODE_CACHE = 4096


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one CPython version keeps what a stack read needs (bytes from each struct's
    start). frame_via_cframe: the thread state points at a _PyCFrame whose current_frame is
    the frame (3.11, 3.12); tid_is_native: the thread state holds the kernel thread id (3.11+;
    3.10 holds only pthread_self(), read through glibc's struct pthread)."""

    version: tuple[int, int]
    runtime_interpreters_head: int
    interp_next: int
    interp_threads_head: int
    tstate_next: int
    tstate_tid: int
    tid_is_native: bool
    tstate_frame: int
    frame_via_cframe: bool
    cframe_current_frame: int
    frame_code: int
    frame_previous: int
    frame_owner: int  # -1: no owner field (3.10 frame objects)
    code_filename: int
    code_name: int  # co_qualname where the version has it
    code_firstlineno: int
    unicode_state: int
    unicode_length: int
    unicode_ascii_size: int
    unicode_compact_size: int


# offsetof() over each version's headers (x86-64, the default, non-debug, GIL build).
LAYOUTS: dict[tuple[int, int], Layout] = {
    (3, 10): Layout((3, 10), 32, 0, 8, 8, 176, False, 24, False, 0, 32, 24, -1,
                    104, 112, 40, 32, 16, 48, 72),
    (3, 11): Layout((3, 11), 40, 0, 16, 8, 160, True, 56, True, 8, 32, 48, 69,
                    112, 128, 72, 32, 16, 48, 72),
    (3, 12): Layout((3, 12), 40, 0, 72, 8, 144, True, 56, True, 0, 0, 8, 70,
                    112, 128, 68, 32, 16, 40, 56),
}  # fmt: skip

# Where 3.13's _Py_DebugOffsets keeps each offset (offsetof() over its header): the runtime's
# own description of its layout. 3.14 grew the struct, so its positions are not these.
DEBUG_FIELDS_313 = {
    "version": 8, "free_threaded": 16, "runtime_interpreters_head": 40, "interp_next": 64,
    "interp_threads_head": 72, "tstate_next": 168, "tstate_frame": 184,
    "tstate_tid": 200, "frame_previous": 232, "frame_code": 240, "frame_owner": 264,
    "code_filename": 280, "code_name": 296, "code_firstlineno": 312, "unicode_state": 544,
    "unicode_length": 552, "unicode_ascii_size": 560,
}  # fmt: skip
DEBUG_SIZE_313 = 584


class NotReadable(Exception):
    """This interpreter's stacks cannot be read: one line why; path: the interpreter file
    ("" when the process runs none that was found)."""

    def __init__(self, why: str, path: str = "") -> None:
        super().__init__(why)
        self.path = path


def layout_from_debug_offsets(raw: bytes) -> Layout:
    """The layout a 3.13 runtime describes at the start of its _PyRuntime."""
    if raw[:8] != DEBUG_COOKIE:
        raise NotReadable("no _Py_DebugOffsets at _PyRuntime (not a 3.13+ runtime)")
    f = {k: struct.unpack_from("<Q", raw, off)[0] for k, off in DEBUG_FIELDS_313.items()}
    version = ((f["version"] >> 24) & 0xFF, (f["version"] >> 16) & 0xFF)
    if version != (3, 13):
        raise NotReadable(f"CPython {version[0]}.{version[1]}: its debug offsets are not read")
    if f["free_threaded"]:
        raise NotReadable("a free-threaded build (3.13t): its frames are not read")
    ascii_size = f.pop("unicode_ascii_size")
    del f["version"], f["free_threaded"]
    # 3.12+: a compact non-ASCII string adds utf8_length and utf8 to the ASCII header.
    return Layout(version=version, tid_is_native=True, frame_via_cframe=False,
                  cframe_current_frame=0, unicode_ascii_size=ascii_size,
                  unicode_compact_size=ascii_size + 16, **f)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame: func (qualified where the version has co_qualname), file, and line
    where the function starts (co_firstlineno)."""

    func: str
    file: str
    line: int


# ---------------------------------------------------------------------------------------
# Reading another process's memory.


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_readv = _libc.process_vm_readv
_readv.restype = ctypes.c_ssize_t
_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]  # fmt: skip


class Memory:
    """Reads of one process's memory; a read that fails (unmapped, process gone) raises
    OSError."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._buf = ctypes.create_string_buffer(4096)
        self._local = _Iovec(ctypes.cast(self._buf, ctypes.c_void_p), 0)
        self._remote = _Iovec(0, 0)

    def read(self, addr: int, size: int) -> bytes:
        if size > len(self._buf):
            self._buf = ctypes.create_string_buffer(size)
            self._local.base = ctypes.cast(self._buf, ctypes.c_void_p)
        self._local.len = size
        self._remote.base, self._remote.len = addr, size
        got = _readv(self.pid, ctypes.byref(self._local), 1, ctypes.byref(self._remote), 1, 0)
        if got != size:
            err = ctypes.get_errno() if got < 0 else 0
            raise OSError(err, f"pid {self.pid}: read of {size} bytes at {addr:#x} failed")
        return self._buf.raw[:size]

    def pointer(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")


# ---------------------------------------------------------------------------------------
# glibc's struct pthread: where it keeps the kernel thread id (3.10's thread states hold only
# pthread_self()). Found once in this process: the word of our own struct pthread that holds
# our tid, confirmed by a second thread.


def _tid_offset_in(pthread: int, tid: int) -> set[int]:
    raw = ctypes.string_at(pthread, 1024)
    want = struct.pack("<i", tid)
    return {off for off in range(0, len(raw) - 3, 4) if raw[off : off + 4] == want}


_PTHREAD_TID: list[int | None] = []


def pthread_tid_offset() -> int | None:
    """Offset of the tid in glibc's struct pthread (None: not found in this libc)."""
    if not _PTHREAD_TID:
        self_fn = _libc.pthread_self
        self_fn.restype = ctypes.c_void_p
        mine = _tid_offset_in(self_fn(), threading.get_native_id())
        other: list[set[int]] = []
        t = threading.Thread(
            target=lambda: other.append(_tid_offset_in(self_fn(), threading.get_native_id()))
        )
        t.start()
        t.join()
        both = sorted(mine & other[0]) if other else []
        _PTHREAD_TID.append(both[0] if both else None)
    return _PTHREAD_TID[0]


# ---------------------------------------------------------------------------------------
# Finding the runtime in a process.


def version_of(path: str) -> tuple[int, int] | None:
    """(3, X) from an interpreter file's name (python3.11, libpython3.12.so.1.0)."""
    m = _VERSION.match(os.path.basename(path))
    return (int(m.group(1)), int(m.group(2))) if m else None


def runtime_address(pid: int, proc: Path = Path("/proc")) -> tuple[str, int, int]:
    """(file, address of _PyRuntime in the process, address of PyCode_Type) from the files
    the process maps; NotReadable when none of them is a CPython 3 runtime."""
    lowest: dict[str, int] = {}  # file -> its lowest mapping with file offset 0
    paths = HostPaths(proc=proc)
    try:
        maps = read_maps(paths, pid)
    except OSError as err:
        raise NotReadable(f"pid {pid}: {err.strerror}") from None
    for m in maps:
        if m.offset == 0 and version_of(m.path) and m.path not in lowest:
            lowest[m.path] = m.start
    for path, start in lowest.items():
        symbols = _runtime_symbols(Path(in_root(paths, pid, path)))
        if symbols is not None:
            base, runtime, code_type = symbols
            return path, start - base + runtime, start - base + code_type
    raise NotReadable(f"pid {pid}: no CPython runtime (_PyRuntime) in the files it maps")


_SYMBOLS: dict[tuple[int, int], tuple[int, int, int] | None] = {}


def _runtime_symbols(path: Path) -> tuple[int, int, int] | None:
    """(first loaded page, _PyRuntime, PyCode_Type) as the file's addresses, None when it
    has not both. Read once per file (by device and inode): a libpython is tens of MB."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (st.st_dev, st.st_ino)
    if key not in _SYMBOLS:
        try:
            with ElfFile(path) as elf:
                found = elf.symbols({"_PyRuntime", "PyCode_Type"}, STT_OBJECT)
                base = min(vaddr for vaddr, _, _ in elf.loads) // 4096 * 4096
        except (OSError, ValueError, IndexError, struct.error):  # odd, cut short, no PT_LOAD
            return None
        ok = "_PyRuntime" in found and "PyCode_Type" in found
        _SYMBOLS[key] = (base, found["_PyRuntime"], found["PyCode_Type"]) if ok else None
    return _SYMBOLS[key]


class Interpreter:
    """One process's CPython: its threads' current frames, read on demand."""

    def __init__(self, pid: int, proc: Path = Path("/proc")) -> None:
        self.pid = pid
        self.path, self.runtime, self.code_type = runtime_address(pid, proc)
        self.mem = Memory(pid)
        version = version_of(self.path)
        try:
            if version is not None and version >= (3, 13):
                self.layout = layout_from_debug_offsets(self.mem.read(self.runtime, DEBUG_SIZE_313))
            elif version in LAYOUTS:
                self.layout = LAYOUTS[version]
            else:
                raise NotReadable(f"CPython {version}: no frame layout known for it")
            if not self.layout.tid_is_native and pthread_tid_offset() is None:
                raise NotReadable("CPython 3.10: no thread id found in this libc's pthread")
        except OSError as err:
            raise NotReadable(f"pid {pid}: {err}", self.path) from None
        except NotReadable as err:
            raise NotReadable(str(err), self.path) from None
        self._codes: OrderedDict[tuple[int, ...], Frame] = OrderedDict()

    @property
    def version(self) -> str:
        return "{}.{}".format(*self.layout.version)

    def threads(self) -> dict[int, int]:
        """Kernel thread id -> its thread state's address, for every Python thread."""
        lay, mem = self.layout, self.mem
        out: dict[int, int] = {}
        # The thread id and the next thread state in one read (a read is a system call;
        # this list is read once a second for every watched interpreter).
        first = min(lay.tstate_tid, lay.tstate_next)
        span = max(lay.tstate_tid, lay.tstate_next) + 8 - first
        interp = mem.pointer(self.runtime + lay.runtime_interpreters_head)
        for _ in range(8):  # sub-interpreters: a few
            if not interp:
                break
            ts = mem.pointer(interp + lay.interp_threads_head)
            for _ in range(1024):
                if not ts:
                    break
                raw = mem.read(ts + first, span)
                tid, following = (struct.unpack_from("<Q", raw, at - first)[0]
                                  for at in (lay.tstate_tid, lay.tstate_next))  # fmt: skip
                if not lay.tid_is_native and tid:
                    off = pthread_tid_offset() or 0
                    tid = struct.unpack("<i", mem.read(tid + off, 4))[0]
                out[tid] = ts
                ts = following
            interp = mem.pointer(interp + lay.interp_next)
        return out

    def stack(self, tstate: int, depth: int) -> list[Frame]:
        """The thread's innermost `depth` Python frames, innermost first (empty: it runs no
        Python code now). OSError when a read fails."""
        lay, mem = self.layout, self.mem
        frame = mem.pointer(tstate + lay.tstate_frame)
        if lay.frame_via_cframe and frame:
            frame = mem.pointer(frame + lay.cframe_current_frame)
        span = max(lay.frame_code, lay.frame_previous, lay.frame_owner) + 8
        out: list[Frame] = []
        for _ in range(MAX_DEPTH):
            if not frame or len(out) >= depth:
                break
            raw = mem.read(frame, span)
            code, previous = (struct.unpack_from("<Q", raw, o)[0]
                              for o in (lay.frame_code, lay.frame_previous))  # fmt: skip
            if lay.frame_owner < 0 or raw[lay.frame_owner] != OWNED_BY_CSTACK:
                found = self._code(code)
                if found is not None:
                    out.append(found)
            frame = previous
        return out

    def _code(self, code: int) -> Frame | None:
        """A code object's frame (None: not a code object)."""
        lay = self.layout
        end = max(lay.code_filename, lay.code_name, lay.code_firstlineno) + 8
        raw = self.mem.read(code, end)
        if struct.unpack_from("<Q", raw, 8)[0] != self.code_type:
            return None
        file_p, name_p = (struct.unpack_from("<Q", raw, o)[0]
                          for o in (lay.code_filename, lay.code_name))  # fmt: skip
        return self.frame_at(
            code, file_p, name_p, struct.unpack_from("<i", raw, lay.code_firstlineno)[0]
        )

    def frame_at(self, code: int, file_p: int, name_p: int, line: int) -> Frame:
        """The frame of the code object at `code`, whose file and name are the str objects at
        file_p and name_p (as read from it). Their text is read once: cached by all four, so
        a code object freed and another allocated at its address is read afresh. OSError when
        a read fails."""
        key = (code, file_p, name_p, line)
        found = self._codes.get(key)
        if found is not None:
            self._codes.move_to_end(key)
            return found
        found = self._codes[key] = Frame(self._str(name_p), self._str(file_p), line)
        if len(self._codes) > CODE_CACHE:
            self._codes.popitem(last=False)
        return found

    def _str(self, addr: int, limit: int = 512) -> str:
        """A str object's text (compact strings: what code objects hold), cut at limit."""
        lay = self.layout
        head = self.mem.read(addr, lay.unicode_ascii_size)
        length = min(struct.unpack_from("<q", head, lay.unicode_length)[0], limit)
        state = struct.unpack_from("<I", head, lay.unicode_state)[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or length < 0:
            return "?"
        start = lay.unicode_ascii_size if ascii_ else lay.unicode_compact_size
        data = self.mem.read(addr + start, length * kind) if length else b""
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        try:
            # A file name of bytes that are not UTF-8 holds os.fsdecode's surrogates: kept,
            # they are written as every other name is (`\\xff`), not as U+FFFD for each.
            return jsonable(data.decode(codec, errors="surrogatepass"))
        except UnicodeDecodeError:  # no str's text: the object changed under the read
            return data.decode(codec, errors="replace")
