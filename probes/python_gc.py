"""python_gc: CPython's cyclic garbage collections in watched processes (python_gc.bpf.c).

Where: the interpreter each watched process runs, found in /proc/PID/maps (a `python3.X`
executable, or a `libpython3.X.so` it loads; a venv's python is the same file through a
symlink), attached once per distinct file as processes appear (mapped_scan.py, as the cuda
probe finds libcuda). How, by what the build offers:
  usdt    the markers python:gc__start / python:gc__done (CPython built --with-dtrace:
          Debian's and Ubuntu's python3.X). Their semaphores are raised by the kernel
          (uprobe ref_ctr_offset), so nothing writes into the process.
  symbol  no markers but a gc_collect_main symbol (.symtab or .dynsym): a uprobe on it and
          a uretprobe (3.8-3.12 signature: the generation is its second argument).
  none    "no GC probe for this interpreter" in the probe's status; the probe keeps going.
Collections of `pause` (default 1 ms) or more are streamed as GcPause; the others are counted
in a log2 histogram per generation. Cost: a uprobe hit at each collection's start and end
(docs/probes.md has the figure), nothing between collections.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes as ct
import os
import re
import shutil
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujitter.probes import contract, uprobe_multi
from gpujitter.probes.base import BpfProbe, ProbeContext
from gpujitter.probes.elf import SHT_NOTE, ElfFile
from gpujitter.probes.events import Event, GcPause
from gpujitter.probes.host import HostPaths
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.mapped_scan import MappedScan, file_key
from gpujitter.probes.perf_event import PerfEventAttr, bpf_event_fd
from gpujitter.probes.procfs import alive, in_root, mapped_files
from gpujitter.probes.registry import Hook, ProbeSpec
from gpujitter.probes.watch import ExitReader

MAX_INTERPRETERS = 64  # interpreter files with markers, each a slot of interp_args
SLOT_PROGRAMS = 8  # without uprobe-multi links, the slots with programs (GJ_PER_SLOT's copies)
GENERATIONS = 3
# Register names of stapsdt argument specs; reg_value() in the .bpf.c reads them by index.
REGISTERS = ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "ip")  # fmt: skip
REG_NONE = 255
COLLECTOR_SYMBOLS = ("gc_collect_main",)
INTERPRETER = re.compile(r"^(lib)?python\d(\.\d+)?[a-z]*(\.so(\.[\d.]+)?)?$")
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")
NO_GC_PROBE = "no GC probe for this interpreter"


# ---------------------------------------------------------------------------------------
# Where a build's collector can be probed.


@dataclass(frozen=True, slots=True)
class MarkerArg:
    """Where a USDT argument lives (stapsdt spec "-4@112(%rsp)", "-8@%r12", "4@$2")."""

    size: int
    signed: bool
    reg: int  # index into REGISTERS, REG_NONE for a constant
    deref: bool
    off: int

    def pack(self) -> bytes:
        """As struct gc_arg in python_gc.bpf.c."""
        return struct.pack("<qBBBBB3x", self.off, self.reg, self.deref, self.size,
                           self.signed, 1)  # fmt: skip


UNKNOWN_ARG = b"\0" * 16  # struct gc_arg with valid = 0: the value reads as -1


def parse_arg(spec: str) -> MarkerArg | None:
    """One stapsdt argument, or None for a form this probe does not read (an index
    register, a segment, a symbol)."""
    m = re.fullmatch(r"(-?)(1|2|4|8)@(.+)", spec.strip())
    if not m:
        return None
    signed, size, where = m.group(1) == "-", int(m.group(2)), m.group(3)
    if where.startswith("$"):
        with contextlib.suppress(ValueError):
            return MarkerArg(size, signed, REG_NONE, False, int(where[1:], 0))
        return None
    mem = re.fullmatch(r"(-?(?:0x[0-9a-fA-F]+|\d+))?\(%(\w+)\)", where)
    name = mem.group(2) if mem else where.lstrip("%") if where.startswith("%") else ""
    reg = _register(name)
    if reg is None:
        return None
    off = int(mem.group(1), 0) if mem and mem.group(1) else 0
    return MarkerArg(size, signed, reg, mem is not None, off)


def _register(name: str) -> int | None:
    """x86-64 register name in any width (rax, eax, ax, al, r12d, r12w, r12b) -> index."""
    if re.fullmatch(r"r(8|9|1[0-5])[dwb]?", name):
        return REGISTERS.index(re.sub(r"[dwb]$", "", name))
    base = {"al": "ax", "bl": "bx", "cl": "cx", "dl": "dx", "sil": "si", "dil": "di",
            "bpl": "bp", "spl": "sp"}.get(name) or name.lstrip("re")  # fmt: skip
    if base in ("a", "b", "c", "d"):
        base += "x"
    return REGISTERS.index(base) if base in REGISTERS else None


@dataclass(frozen=True, slots=True)
class Marker:
    """One USDT marker: where its uprobe goes and its semaphore (file offsets; semaphore 0:
    none), and its argument."""

    offset: int
    semaphore: int
    arg: MarkerArg | None


def usdt_markers(elf: ElfFile, provider: str = "python") -> dict[str, Marker]:
    """The provider's markers in the file's .note.stapsdt, by name."""
    base_sec = elf.section(".stapsdt.base")
    out: dict[str, Marker] = {}
    for sec in elf.sections:
        if sec[1] != SHT_NOTE:
            continue
        pos, stop = sec[4], sec[4] + sec[5]
        while pos + 12 <= stop:
            namesz, descsz, ntype = struct.unpack_from("<III", elf.data, pos)
            owner = elf.data[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            desc = pos + 12 + _align4(namesz)
            pos = desc + _align4(descsz)
            if owner != b"stapsdt" or ntype != 3:
                continue
            pc, note_base, sem = struct.unpack_from("<QQQ", elf.data, desc)
            prov, name, args = elf.data[desc + 24 : desc + descsz].split(b"\0")[:3]
            if prov.decode(errors="replace") != provider:
                continue
            if base_sec is not None:  # a prelinked file moved the code: follow it
                pc += base_sec[3] - note_base
            arg = parse_arg(args.decode(errors="replace").split()[0]) if args else None
            try:
                offset = elf.file_offset(pc)
                semaphore = elf.file_offset(sem) if sem else 0
            except ValueError:
                continue
            out.setdefault(name.decode(errors="replace"), Marker(offset, semaphore, arg))
    return out


def _align4(n: int) -> int:
    return (n + 3) & ~3


@dataclass(frozen=True, slots=True)
class Hooks:
    """How one interpreter file's collections are probed: via "usdt", "symbol", "none" (why:
    one line) or "launcher" (an executable without the interpreter in it)."""

    via: str
    start: Marker | None = None
    done: Marker | None = None
    symbol: str = ""
    symbol_address: int = 0  # the ELF's virtual address, as bcc's attach_uprobe(addr=) takes
    why: str = ""


def interpreter_hooks(path: str | Path, ref_ctr: bool = True) -> Hooks:
    """Where to probe the collector of the interpreter in `path`. ref_ctr: the kernel can
    raise USDT semaphores (else markers guarded by one are of no use)."""
    try:
        with ElfFile(path) as elf:
            markers = usdt_markers(elf)
            found = elf.functions({*COLLECTOR_SYMBOLS, "PyGC_Collect"})
        addresses = {s: found[s] for s in COLLECTOR_SYMBOLS if s in found}
    except (OSError, ValueError, IndexError, struct.error) as err:  # a truncated or odd file
        return Hooks("none", why=f"{NO_GC_PROBE}: {path}: {err}")
    start, done = markers.get("gc__start"), markers.get("gc__done")
    usable = start is not None and done is not None
    if usable and (ref_ctr or not (start.semaphore or done.semaphore)):  # type: ignore[union-attr]
        return Hooks("usdt", start=start, done=done)
    for symbol, address in addresses.items():
        return Hooks("symbol", symbol=symbol, symbol_address=address)
    if not usable and "PyGC_Collect" not in found:
        # A launcher (python3.X linked against libpython): the collector is in the library,
        # which the process maps too.
        return Hooks("launcher", why="no collector here: the process's libpython has it")
    if usable:
        return Hooks("none", why=f"{NO_GC_PROBE}: its markers need a USDT semaphore, which "
                     "this kernel cannot raise (no uprobe ref_ctr_offset)")  # fmt: skip
    return Hooks("none", why=f"{NO_GC_PROBE}: no python:gc__start/gc__done markers (a build "
                 "without --with-dtrace) and no gc_collect_main symbol (stripped)")  # fmt: skip


def node_interpreter() -> Path:
    """The node's python3 (PATH) when it is a program, not a wrapper script (pyenv's shims
    are), else the one running gpujitter: what doctor judges, not knowing which interpreter
    the jobs will run."""
    for found in (shutil.which("python3"), sys.executable):
        path = Path(os.path.realpath(found)) if found else None
        with contextlib.suppress(OSError), open(path or os.devnull, "rb") as f:
            if path is not None and f.read(4) == b"\x7fELF":
                return path
    return Path(os.path.realpath(sys.executable))


def kernel_has_ref_ctr(pmu: Path = UPROBE_PMU) -> bool:
    """Whether uprobes can raise a USDT semaphore themselves (Linux 4.20+)."""
    return (pmu / "format" / "ref_ctr_offset").exists()


def interpreter_files(pid: int, paths: HostPaths | None = None) -> list[tuple[str, str]]:
    """Interpreter files process `pid` maps: (path as mapped, path this process can open
    through /proc/PID/root)."""
    paths = paths or HostPaths()
    return [
        (p, in_root(paths, pid, p))
        for p in mapped_files(paths, pid, executable=True, containing="python")  # INTERPRETER's
        if INTERPRETER.match(os.path.basename(p))
    ]


# ---------------------------------------------------------------------------------------
# Attaching a uprobe that raises a semaphore: perf_event_open on the uprobe PMU, which bcc's
# Python attach_uprobe does not offer (it has no ref_ctr_offset).


def attach_uprobe_fd(prog_fd: int, path: str, offset: int, ref_ctr_offset: int = 0) -> int:
    """A uprobe at `offset` of file `path` running BPF program prog_fd, raising the counter
    at file offset ref_ctr_offset while attached (0: none). Returns the perf event fd (close
    it to detach); raises OSError."""
    attr = PerfEventAttr()
    attr.type = int((UPROBE_PMU / "type").read_text())
    attr.config = ref_ctr_offset << 32
    name = ct.create_string_buffer(os.fsencode(path))
    attr.config1 = ct.addressof(name)
    attr.config2 = offset
    return bpf_event_fd(attr, -1, 0, prog_fd, f"uprobe {path}+{offset:#x}")


# ---------------------------------------------------------------------------------------
# The probes that attach per interpreter file.


# What the .bpf.c gets as -D options (it never restates them).
CONSTANTS = {
    "GENERATIONS": GENERATIONS,
    "MAX_INTERPRETERS": MAX_INTERPRETERS,
    **contract.indexes("GC_REG", REGISTERS, count=False),
    "REG_NONE": REG_NONE,
}


class InterpreterProbe(BpfProbe):
    """A probe that attaches once per interpreter file the watched processes run (found in
    their maps, as they join the watched set: mapped_scan.py). A subclass says how one file
    is probed (add_interpreter) and how that reads in the status line (describe)."""

    per_thread: tuple[str, ...] = ()  # its maps keyed by thread (or process) id

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.scan = MappedScan()
        self._core: Any = None  # the watched set (probes/watch.py CoreBpf)
        self._exits: ExitReader | None = None  # its exits, at each rescan
        self.paths = HostPaths()
        # Interpreter files looked at, by (dev, inode): (the path as mapped, how probed).
        self.interpreters: dict[tuple[int, int], tuple[str, Any]] = {}

    def start(self, ctx: ProbeContext) -> None:
        self._core = ctx.watched_set("scan")
        self._exits = ExitReader(self._core)
        super().start(ctx)
        self._update_state()

    def scan_processes(self) -> None:
        for pid in self.scan.due(self._core.watched_pids(), time.monotonic_ns()):
            files = interpreter_files(pid, self.paths)
            for mapped, local in files:
                self.add_interpreter(mapped, local)
            if files:
                self.scan.done(pid)
        self._update_state()

    @abc.abstractmethod
    def add_interpreter(self, mapped: str, local: str) -> Any:
        """Probe the interpreter file at `local` (mapped as `mapped`), once per file."""

    @abc.abstractmethod
    def describe(self, how: Any) -> str | None:
        """How one file was probed, for the status line (None: not worth a mention)."""

    def _update_state(self) -> None:
        self.state = "running"
        said = [(mapped, self.describe(how)) for mapped, how in self.interpreters.values()]
        self.reason = (
            "; ".join(f"{os.path.basename(m)} ({m}): {text}" for m, text in said if text)
            or "no Python interpreter seen in the watched processes yet"
        )

    def rescan(self, now_ns: int) -> None:
        """At each tick: processes that appeared, and per-thread map entries of threads that
        exited inside what the probe times (their return never came)."""
        self.scan_processes()
        assert self._exits is not None  # started
        exited = self._exits.take(now_ns)
        if exited == []:
            return
        tables = [self.bpf[name] for name in self.per_thread]
        if exited is None:  # a walk of the maps and /proc
            self.scan.forget_exited()
            for table in tables:
                for key in list(table):
                    if not alive(self.paths, key.value):
                        del table[key]
            return
        for tgid, tid in exited:
            if tid == tgid:
                self.scan.forget(tgid)
            for table in tables:  # keyed by thread id, or by process id (the same id)
                with contextlib.suppress(KeyError):
                    del table[table.Key(tid)]


class PythonGcProbe(InterpreterProbe):
    bpf_file = "python_gc.bpf.c"
    rings = ("gc_events",)
    constants = CONSTANTS
    per_thread = ("running",)

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.ref_ctr = kernel_has_ref_ctr()
        self._fds: list[int] = []  # perf events or uprobe-multi links: closed, detached
        self._slots = 0
        # One program per marker, its slot the links' cookie, where the kernel makes
        # uprobe-multi links and the option `uprobe_multi` is not off; else a copy per slot.
        self.linked = True
        self._hists: Log2Map | None = None

    def cflags(self, ctx: ProbeContext) -> list[str]:
        self.linked = uprobe_multi.wanted(ctx.options.get(self.name, {}))
        return super().cflags(ctx) + ([] if self.linked else ["-DGJ_PER_SLOT"])

    def attach(self, ctx: ProbeContext) -> None:
        self._hists = Log2Map(
            self.bpf["short_log2"], [f"gc.gen{g}" for g in range(GENERATIONS)] + ["gc.unknown"],
            self.name,
        )  # fmt: skip
        self.scan_processes()

    def add_interpreter(self, mapped: str, local: str) -> Hooks | None:
        """Probe the collector of the interpreter file at `local` (once per file)."""
        key = file_key(local)
        if key is None or key in self.interpreters:
            return None
        hooks = interpreter_hooks(local, self.ref_ctr)
        if hooks.via in ("usdt", "symbol"):
            try:
                self._attach(local, hooks)
            except Exception as err:  # bcc raises plain Exception; one file never stops the probe
                hooks = Hooks("none", why=f"{NO_GC_PROBE}: {err}")
        self.interpreters[key] = (mapped, hooks)
        return hooks

    def _attach(self, path: str, hooks: Hooks) -> None:
        if hooks.via == "symbol":
            self.bpf.attach_uprobe(name=path, addr=hooks.symbol_address, fn_name="gc_enter")
            self.bpf.attach_uretprobe(name=path, addr=hooks.symbol_address, fn_name="gc_leave")
            return
        most = MAX_INTERPRETERS if self.linked else SLOT_PROGRAMS
        if self._slots >= most:
            raise RuntimeError(f"more than {most} distinct interpreters")
        slot = self._slots
        assert hooks.start is not None and hooks.done is not None
        args = self.bpf["interp_args"]
        packed = [m.arg.pack() if m.arg else UNKNOWN_ARG for m in (hooks.start, hooks.done)]
        value = args.Leaf.from_buffer_copy(b"".join(packed))
        args[args.Key(slot)] = value
        fds = []
        try:
            for marker, prog in ((hooks.start, "gc_start"), (hooks.done, "gc_done")):
                if self.linked:
                    fd = uprobe_multi.load_program(self.bpf, f"{prog}_any")
                    fds.append(uprobe_multi.link(fd, path, [marker.offset], [slot], returns=False,
                                                 ref_ctr_offsets=[marker.semaphore]))  # fmt: skip
                else:
                    fn = self.bpf.load_func(f"{prog}_{slot}", uprobe_multi.BPF_PROG_TYPE_KPROBE)
                    fds.append(attach_uprobe_fd(fn.fd, path, marker.offset, marker.semaphore))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        self._fds += fds
        self._slots += 1

    def describe(self, how: Any) -> str | None:
        if how.via == "launcher":
            return None
        return str(how.why) if how.via == "none" else f"probed via {how.via}"

    def sample(self, now_ns: int) -> list[Event]:
        self.rescan(now_ns)
        return []

    def log2_maps(self) -> list[Log2Map]:
        return [self._hists] if self._hists is not None else []

    def collections(self) -> dict[str, int]:
        """Collections seen so far per generation ("unknown": the build gave none)."""
        table = self.bpf["collections"]
        names = [*(str(g) for g in range(GENERATIONS)), "unknown"]
        return {n: int(sum(table[table.Key(i)])) for i, n in enumerate(names)}

    def decode(self, ring: str, rec: Any) -> GcPause:
        return GcPause(
            ts_ns=rec.ts_ns,
            dur_ns=rec.dur_ns,
            tid=rec.tid,
            tgid=rec.tgid,
            cpu=rec.cpu,
            generation=rec.generation,
            collected=rec.collected,
        )

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        super().close()


SPECS = (
    ProbeSpec(
        name="python_gc",
        summary="CPython cyclic-GC collections of watched processes (USDT markers or uprobes)",
        default_on=True,
        hooks=(
            Hook("usdt", "python:gc__start", optional=True),
            Hook("usdt", "python:gc__done", optional=True),
        ),
        degrades="Python GC pauses are not told apart: they show as host work",
        factory=PythonGcProbe,
        thresholds={"pause": 1_000_000},
    ),
)
