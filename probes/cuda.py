"""cuda: how watched processes feed their GPUs, from uprobes on the libcuda they have mapped.

Traced: kernel launches (plain, Ex, cooperative, host functions), graph launches, async copies
and memsets, synchronous copies, and stream/event/context synchronisation (entry and return),
each in every variant the driver exports (_v2, per-thread-stream _ptsz/_ptds). The kernel
keeps per-process state and streams only what gap detection needs (cuda.bpf.c): the first
launch after a quiet stretch of `quiet` or more, synchronisations blocked `sync` or more, and
a synchronisation that ends a quiet stretch of `quiet` or more in which work was queued,
however soon it returns (its thread was kept from reaching it while the GPU drained).

Where: the system's libcuda (ldconfig's and the usual driver folders) from the start, and any
other libcuda a watched process maps (/proc/PID/maps, through /proc/PID/root for containers),
attached as it appears. Uprobes are per file, so one attachment serves every process; the BPF
side filters on the watched set. Cost: every call of a traced function by any process takes
a uprobe trap (~0.7 us on the GPU VM), synchronisations also a uretprobe (docs/gpu.md).
"""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujitter.probes import uprobe_multi
from gpujitter.probes.base import BpfProbe, ProbeContext
from gpujitter.probes.events import CudaCall
from gpujitter.probes.mapped_scan import MappedScan, file_key, watched_pids
from gpujitter.probes.registry import Hook, ProbeSpec

# Roles (0: none), per function as GJ_ROLE_<id>; the .bpf.c tells syncs apart by these two.
LAUNCH, GRAPH, COPY, COPY_SYNC, SYNC = 1, 2, 3, 4, 5
CONSTANTS = {"ROLE_COPY_SYNC": COPY_SYNC, "ROLE_SYNC": SYNC}  # -D options
API = {LAUNCH: "launch", GRAPH: "graph", COPY: "copy", COPY_SYNC: "copy", SYNC: "sync"}
MAX_FUNCS = 48  # entry programs in cuda.bpf.c


def _variants(base: str, role: int, suffix: str) -> list[tuple[str, int]]:
    return [(base, role), (base + suffix, role)]


# Function id = index here. The driver exports each entry point once per variant: _v2 names
# replaced the first ABI, _ptsz/_ptds are the per-thread-default-stream forms that code
# compiled with --default-stream per-thread calls.
TRACED: tuple[tuple[str, int], ...] = tuple(
    _variants("cuLaunchKernel", LAUNCH, "_ptsz")
    + _variants("cuLaunchKernelEx", LAUNCH, "_ptsz")
    + _variants("cuLaunchCooperativeKernel", LAUNCH, "_ptsz")
    + [("cuLaunchCooperativeKernelMultiDevice", LAUNCH)]
    + _variants("cuLaunchHostFunc", LAUNCH, "_ptsz")
    + _variants("cuGraphLaunch", GRAPH, "_ptsz")
    + _variants("cuMemcpyAsync", COPY, "_ptsz")
    + _variants("cuMemcpyHtoDAsync_v2", COPY, "_ptsz")
    + _variants("cuMemcpyDtoHAsync_v2", COPY, "_ptsz")
    + _variants("cuMemcpyDtoDAsync_v2", COPY, "_ptsz")
    + _variants("cuMemcpy2DAsync_v2", COPY, "_ptsz")
    + _variants("cuMemcpy3DAsync_v2", COPY, "_ptsz")
    + _variants("cuMemcpyPeerAsync", COPY, "_ptsz")
    + _variants("cuMemcpyBatchAsync", COPY, "_ptsz")
    + _variants("cuMemcpyBatchAsync_v2", COPY, "_ptsz")
    + _variants("cuMemsetD8Async", COPY, "_ptsz")
    + _variants("cuMemsetD32Async", COPY, "_ptsz")
    + _variants("cuMemcpy", COPY_SYNC, "_ptds")
    + _variants("cuMemcpyHtoD_v2", COPY_SYNC, "_ptds")
    + _variants("cuMemcpyDtoH_v2", COPY_SYNC, "_ptds")
    + _variants("cuMemcpyDtoD_v2", COPY_SYNC, "_ptds")
    + [("cuCtxSynchronize", SYNC), ("cuCtxSynchronize_v2", SYNC)]
    + _variants("cuStreamSynchronize", SYNC, "_ptsz")
    + [("cuEventSynchronize", SYNC)]
)
assert len(TRACED) <= MAX_FUNCS
FUNC_NAMES = tuple(name for name, _ in TRACED)

ENDBR64 = b"\xf3\x0f\x1e\xfa"
# Driver folders searched besides ldconfig's cache (container images, NVIDIA's own layout).
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
)


# ---------------------------------------------------------------------------------------
# ELF: exported functions and the bytes they start with (no binutils needed).


@dataclass(frozen=True, slots=True)
class ElfImage:
    functions: dict[str, int]  # exported function -> virtual address
    loads: tuple[tuple[int, int, int], ...]  # PT_LOAD (vaddr, file offset, file size)

    def file_offset(self, vaddr: int) -> int | None:
        for start, offset, size in self.loads:
            if start <= vaddr < start + size:
                return vaddr - start + offset
        return None


def read_elf(path: str | Path) -> ElfImage:
    """Exported (defined, global or weak) functions of a 64-bit little-endian ELF file.
    Mapped, not read: only the pages of its headers and symbols become resident (a libcuda
    is ~100 MB; reading it whole was the daemon's peak memory on a GPU node)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 64:  # not even an ELF header (nor mappable if empty)
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as data:
            return _elf_functions(path, data)


def _elf_functions(path: str | Path, data: mmap.mmap) -> ElfImage:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads = []
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    functions: dict[str, int] = {}
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        strtab = sections[sh[6]]  # sh_link: the string table
        str_off = strtab[4]
        offset, size, entsize = sh[4], sh[5], sh[9] or 24
        for pos in range(offset, offset + size, entsize):
            st_name, st_info, _other, st_shndx, st_value, _size = struct.unpack_from(
                "<IBBHQQ", data, pos
            )
            if st_info & 0xF != 2 or st_shndx == 0 or st_info >> 4 not in (1, 2):
                continue  # not a defined global/weak function
            end = data.find(b"\0", str_off + st_name)
            if end < 0:
                raise ValueError(f"{path}: a symbol name runs past the end of the file")
            functions[data[str_off + st_name : end].decode(errors="replace")] = st_value
    return ElfImage(functions=functions, loads=tuple(loads))


def probe_address(path: str | Path, image: ElfImage, symbol: str) -> int | None:
    """Where to put the uprobe for `symbol`: past an endbr64 if the function starts with one
    (a uprobe on endbr64 is single-stepped, ~5x the cost), else at its first instruction."""
    vaddr = image.functions.get(symbol)
    if vaddr is None:
        return None
    offset = image.file_offset(vaddr)
    if offset is None:
        return None
    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(4)
    return vaddr + 4 if head == ENDBR64 else vaddr


def armed_sites(pid: int, path: str) -> dict[str, bool]:
    """For each traced function `path` exports: does its probe address in process `pid`'s
    memory hold a breakpoint (0xcc, a uprobe in place) now? Checks that a stop detached
    everything, from outside the daemon. Empty when `pid` has not mapped `path`."""
    image = read_elf(path)
    real = os.path.realpath(path)
    mapped = []  # (start, end, file offset) of the file's mappings
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.realpath(fields[5]) == real:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            mapped.append((start, end, int(fields[2], 16)))
    found: dict[str, bool] = {}
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for symbol, _ in TRACED:
            addr = probe_address(path, image, symbol)
            offset = image.file_offset(addr) if addr is not None else None
            where = [
                s + offset - o
                for s, e, o in mapped
                if offset is not None and o <= offset < o + e - s
            ]
            if where:
                mem.seek(where[0])
                found[symbol] = mem.read(1) == b"\xcc"
    return found


# ---------------------------------------------------------------------------------------
# Finding libcuda.


def is_libcuda(path: str) -> bool:
    return os.path.basename(path).startswith("libcuda.so")


def mapped_libcuda(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """The libcuda files process `pid` has mapped, as paths this process can open."""
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and is_libcuda(parts[5]) and parts[5] not in found:
            found.append(parts[5])
    return [str(proc / str(pid) / "root") + p if p.startswith("/") else p for p in found]


def system_libcuda() -> list[str]:
    """libcuda files of this node's driver: ldconfig's cache, then the usual folders."""
    found: list[str] = []
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if "libcuda.so" in line and "=>" in line:
            found.append(line.split("=>", 1)[1].strip())
    for folder in LIB_DIRS:
        for name in ("libcuda.so.1", "libcuda.so"):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                found.append(path)
    return found


# ---------------------------------------------------------------------------------------
# The probe.


class CudaProbe(BpfProbe):
    source = "cuda.bpf.c"
    rings = ("cuda_events",)
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.libs: dict[tuple[int, int], str] = {}  # attached files: (dev, inode) -> path
        self.symbols: dict[str, int] = {}  # traced function -> files it is attached in
        self.failed: dict[str, str] = {}  # path -> why it could not be attached
        # (path, address, entry program, with a return probe): what attach put in place.
        self.attachments: list[tuple[str, int, str, bool]] = []
        # Uprobe-multi links (fds), two per library, where the kernel makes them and the
        # option `uprobe_multi` is not off; else one uprobe per address, as bcc does.
        self.links: list[int] = []
        self.linked = True
        self.scan = MappedScan()
        self._explicit: list[str] = []

    def cflags(self, ctx: ProbeContext) -> list[str]:
        roles = [role for _, role in TRACED] + [0] * (MAX_FUNCS - len(TRACED))
        self.linked = bool(ctx.options.get(self.name, {}).get("uprobe_multi", True))
        self.linked = self.linked and uprobe_multi.supported()
        # The per-address programs only where needed: their 48 copies of the entry path
        # tripled the compile (0.5 -> 1.5 CPU-s here).
        per_address = [] if self.linked else ["-DGJ_PER_ADDRESS"]
        return (
            super().cflags(ctx) + per_address + [f"-DGJ_ROLE_{i}={r}" for i, r in enumerate(roles)]
        )

    def attach(self, ctx: ProbeContext) -> None:
        opts = ctx.options.get(self.name, {})
        self._explicit = [str(p) for p in opts.get("libcuda", ())]
        for path in self._explicit or system_libcuda():
            self.add_library(path)
        self.scan_processes()

    def start(self, ctx: ProbeContext) -> None:
        super().start(ctx)
        self._update_state()

    def _update_state(self) -> None:
        if self.libs:
            self.state, self.reason = "running", ""
        else:
            why = "; ".join(f"{p}: {r}" for p, r in self.failed.items())
            self.state = "degraded"
            self.reason = "no libcuda attached yet" + (f" ({why})" if why else "")

    def add_library(self, path: str) -> bool:
        """Attach every traced function `path` exports; False if it is not usable."""
        key = file_key(path)
        if key is None or key in self.libs:
            return key is not None
        try:
            image = read_elf(path)
        except (OSError, ValueError) as err:
            self.failed[path] = str(err)
            return False
        sites = [
            (func_id, symbol, role, addr)
            for func_id, (symbol, role) in enumerate(TRACED)
            if (addr := probe_address(path, image, symbol)) is not None
        ]
        attached = (self._attach_linked if self.linked else self._attach_each)(path, image, sites)
        if not attached:
            self.failed.setdefault(path, "exports none of the traced functions")
            return False
        self.libs[key] = path
        self.failed.pop(path, None)
        return True

    def _attach_linked(
        self, path: str, image: ElfImage, sites: list[tuple[int, str, int, int]]
    ) -> int:
        """Every site of `path` through two uprobe-multi links: the entries, and the returns
        of synchronising functions. How many sites were attached (all or none)."""
        offsets = [image.file_offset(addr) for _, _, _, addr in sites]
        if not sites or None in offsets:
            return 0
        at = [int(o) for o in offsets if o is not None]
        cookies = [func_id | role << 16 for func_id, _, role, _ in sites]
        syncing = [
            o for o, (_, _, role, _) in zip(at, sites, strict=True) if role in (SYNC, COPY_SYNC)
        ]
        made: list[int] = []
        try:
            enter = uprobe_multi.load_program(self.bpf, "enter_any")
            made.append(uprobe_multi.link(enter, path, at, cookies, returns=False))
            if syncing:
                leave = uprobe_multi.load_program(self.bpf, "leave_any")
                made.append(
                    uprobe_multi.link(leave, path, syncing, [0] * len(syncing), returns=True)
                )
        except Exception as err:
            for fd in made:
                os.close(fd)
            self.failed[path] = str(err)
            return 0
        self.links += made
        for _, symbol, _, _ in sites:
            self.symbols[symbol] = self.symbols.get(symbol, 0) + 1
        return len(sites)

    def _attach_each(
        self, path: str, image: ElfImage, sites: list[tuple[int, str, int, int]]
    ) -> int:
        """One bcc uprobe per site (and a uretprobe for synchronising functions)."""
        attached = 0
        for func_id, symbol, role, addr in sites:
            try:
                self.bpf.attach_uprobe(name=path, addr=addr, fn_name=f"enter_{func_id}")
                if role in (SYNC, COPY_SYNC):
                    self.bpf.attach_uretprobe(name=path, addr=addr, fn_name="leave_sync")
            except Exception as err:
                self.failed[path] = f"{symbol}: {err}"
                continue
            attached += 1
            self.attachments.append((path, addr, f"enter_{func_id}", role in (SYNC, COPY_SYNC)))
            self.symbols[symbol] = self.symbols.get(symbol, 0) + 1
        return attached

    def close(self) -> None:
        """The links first: each detaches all its sites in one kernel wait."""
        while self.links:
            os.close(self.links.pop())
        super().close()

    def scan_processes(self) -> None:
        """Attach libcuda files that watched processes mapped and are not attached yet
        (frameworks load libcuda late, at their first CUDA call: mapped_scan.py says how
        long a process is looked at)."""
        for pid in self.scan.due(watched_pids(self.bpf), time.monotonic_ns()):
            paths = mapped_libcuda(pid)
            for path in paths:
                self.add_library(path)
            if paths:
                self.scan.done(pid)
        self._update_state()

    def sample(self, now_ns: int) -> tuple[()]:
        self.scan_processes()
        self._forget_exited()
        return ()

    def _forget_exited(self) -> None:
        procs = self.bpf["procs"]
        for key in list(procs):
            if not os.path.exists(f"/proc/{key.value}"):
                del procs[key]
        self.scan.forget_exited()
        # A thread that exited inside a synchronisation never returns from it: drop it, or
        # its process would count as synchronising (GPU busy) for good.
        syncs = self.bpf["syncs"]
        for key, entry in list(syncs.items()):
            if os.path.exists(f"/proc/{key.value}"):
                continue
            del syncs[key]
            tgid = procs.Key(entry.tgid)
            state = procs.get(tgid)
            if state is not None and state.syncing > 0:
                state.syncing -= 1
                procs[tgid] = state

    def hit_counts(self) -> dict[str, int]:
        """Calls per traced function so far (watched processes), summed over CPUs."""
        table = self.bpf["hits"]
        return {
            name: int(sum(table[table.Key(i)]))
            for i, name in enumerate(FUNC_NAMES)
            if sum(table[table.Key(i)])
        }

    def decode(self, ring: str, rec: Any) -> CudaCall:
        role = int(rec.role)
        return CudaCall(
            ts_ns=rec.ts_ns,
            dur_ns=rec.dur_ns,
            tid=rec.tid,
            tgid=rec.tgid,
            cpu=rec.cpu,
            api=API[role],  # type: ignore[arg-type]
            func=FUNC_NAMES[rec.func],
            after_idle_ns=rec.after_idle_ns,
            prev_tid=rec.prev_tid,
            prev_api=API.get(int(rec.prev_role), ""),
        )


SPECS = (
    ProbeSpec(
        name="cuda",
        summary="libcuda launches, copies and synchronisations of watched processes (uprobes)",
        default_on=True,
        hooks=tuple(
            Hook("uprobe", f"libcuda:{name}", optional=name != "cuLaunchKernel")
            for name in FUNC_NAMES
        ),
        degrades="GPU gaps are placed from NVML samples only (20 ms power, 200 ms utilisation), "
        "and the threads feeding the GPU are not known",
        factory=CudaProbe,
        thresholds={"quiet": 1_000_000, "sync": 1_000_000},
    ),
)
