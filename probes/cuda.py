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

import contextlib
import os
import struct
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from gpujitter.probes import uprobe_multi
from gpujitter.probes.base import BpfProbe, ProbeContext
from gpujitter.probes.elf import ElfFile
from gpujitter.probes.events import CudaCall
from gpujitter.probes.host import HostPaths
from gpujitter.probes.mapped_scan import MappedScan, file_key
from gpujitter.probes.procfs import alive, in_root, mapped_files, read_maps
from gpujitter.probes.registry import Hook, ProbeSpec
from gpujitter.probes.watch import ExitReader

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
# Where each traced function is probed.


@dataclass(frozen=True, slots=True)
class Site:
    """One traced function in one libcuda: its id and role, its probe address in the ELF
    (what bcc's attach takes) and that address's file offset (what uprobe-multi takes)."""

    func_id: int
    symbol: str
    role: int
    addr: int
    offset: int


def probe_address(elf: ElfFile, symbol: str) -> int | None:
    """Where to put the uprobe for `symbol` (an address of the ELF file): past an endbr64 if
    the function starts with one, else at its first instruction; None when the file does
    not export it or it lies in no loadable segment."""
    vaddr = elf.exported_functions().get(symbol)
    if vaddr is None:
        return None
    try:
        return vaddr + elf.entry_skip(vaddr)
    except ValueError:
        return None


def armed_sites(pid: int, path: str) -> dict[str, bool]:
    """For each traced function `path` exports: does its probe address in process `pid`'s
    memory hold a breakpoint (0xcc, a uprobe in place) now? Checks that a stop detached
    everything, from outside the daemon. Empty when `pid` has not mapped `path`."""
    real = os.path.realpath(path)
    mapped = [m for m in read_maps(HostPaths(), pid) if os.path.realpath(m.path) == real]
    found: dict[str, bool] = {}
    with ElfFile(path) as elf, open(f"/proc/{pid}/mem", "rb") as mem:
        for symbol, _ in TRACED:
            addr = probe_address(elf, symbol)
            if addr is None:
                continue
            offset = elf.file_offset(addr)
            where = [m.address_of(offset) for m in mapped if m.holds(offset)]
            if where:
                mem.seek(where[0])
                found[symbol] = mem.read(1) == b"\xcc"
    return found


# ---------------------------------------------------------------------------------------
# Finding libcuda.


LIBCUDA_NAME = "libcuda.so"  # how every libcuda file's name begins


def is_libcuda(path: str) -> bool:
    return os.path.basename(path).startswith(LIBCUDA_NAME)


def mapped_libcuda(pid: int, paths: HostPaths | None = None) -> list[str]:
    """The libcuda files process `pid` has mapped, as paths this process can open."""
    paths = paths or HostPaths()
    mapped = mapped_files(paths, pid, containing=LIBCUDA_NAME)
    return [in_root(paths, pid, p) for p in mapped if is_libcuda(p)]


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
    bpf_file = "cuda.bpf.c"
    rings = ("cuda_events",)
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.libs: dict[tuple[int, int], str] = {}  # attached files: (dev, inode) -> path
        self._core: Any = None  # the watched set (probes/watch.py CoreBpf)
        self._exits: ExitReader | None = None  # its exits, at each sample
        self.symbols: dict[str, int] = {}  # traced function -> files it is attached in
        self.failed: dict[str, str] = {}  # path -> why it could not be attached
        # (path, address, entry program, with a return probe): what attach put in place.
        self.attachments: list[tuple[str, int, str, bool]] = []
        # Uprobe-multi links (fds), two per library, where the kernel makes them and the
        # option `uprobe_multi` is not off; else one uprobe per address, as bcc does.
        self.links: list[int] = []
        self.linked = True
        self.scan = MappedScan()
        self.paths = HostPaths()
        self._explicit: list[str] = []

    def cflags(self, ctx: ProbeContext) -> list[str]:
        roles = [role for _, role in TRACED] + [0] * (MAX_FUNCS - len(TRACED))
        self.linked = uprobe_multi.wanted(ctx.options.get(self.name, {}))
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
        self._core = ctx.watched_set("scan")
        self._exits = ExitReader(self._core)
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
            with ElfFile(path) as elf:
                sites = [
                    Site(func_id, symbol, role, addr, elf.file_offset(addr))
                    for func_id, (symbol, role) in enumerate(TRACED)
                    if (addr := probe_address(elf, symbol)) is not None
                ]
        except (OSError, ValueError, IndexError, struct.error) as err:  # cut short or odd
            self.failed[path] = str(err)
            return False
        attached = (self._attach_linked if self.linked else self._attach_each)(path, sites)
        if not attached:
            self.failed.setdefault(path, "exports none of the traced functions")
            return False
        self.libs[key] = path
        self.failed.pop(path, None)
        return True

    def _attach_linked(self, path: str, sites: list[Site]) -> int:
        """Every site of `path` through two uprobe-multi links: the entries, and the returns
        of synchronising functions. How many sites were attached (all or none)."""
        if not sites:
            return 0
        at = [site.offset for site in sites]
        cookies = [site.func_id | site.role << 16 for site in sites]
        syncing = [site.offset for site in sites if site.role in (SYNC, COPY_SYNC)]
        made: list[int] = []
        try:
            # Returns first: a sync entered between the two links would otherwise be seen
            # going in and never coming out, and its thread and process stay "inside a sync"
            # (every later sync of that thread nested in it, no quiet stretch of the
            # process reported) for as long as the thread lives. A return whose entry was
            # not seen is ignored.
            if syncing:
                leave = uprobe_multi.load_program(self.bpf, "leave_any")
                made.append(
                    uprobe_multi.link(leave, path, syncing, [0] * len(syncing), returns=True)
                )
            enter = uprobe_multi.load_program(self.bpf, "enter_any")
            made.append(uprobe_multi.link(enter, path, at, cookies, returns=False))
        except Exception as err:
            for fd in made:
                os.close(fd)
            self.failed[path] = str(err)
            return 0
        self.links += made
        for site in sites:
            self.symbols[site.symbol] = self.symbols.get(site.symbol, 0) + 1
        return len(sites)

    def _attach_each(self, path: str, sites: list[Site]) -> int:
        """One bcc uprobe per site (and a uretprobe for synchronising functions)."""
        attached = 0
        for site in sites:
            entry, syncing = f"enter_{site.func_id}", site.role in (SYNC, COPY_SYNC)
            try:  # the return first, as in _attach_linked
                if syncing:
                    self.bpf.attach_uretprobe(name=path, addr=site.addr, fn_name="leave_sync")
                self.bpf.attach_uprobe(name=path, addr=site.addr, fn_name=entry)
            except Exception as err:
                self.failed[path] = f"{site.symbol}: {err}"
                continue
            attached += 1
            self.attachments.append((path, site.addr, entry, syncing))
            self.symbols[site.symbol] = self.symbols.get(site.symbol, 0) + 1
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
        for pid in self.scan.due(self._core.watched_pids(), time.monotonic_ns()):
            libs = mapped_libcuda(pid, self.paths)
            for path in libs:
                self.add_library(path)
            if libs:
                self.scan.done(pid)
        self._update_state()

    def sample(self, now_ns: int) -> tuple[()]:
        self.scan_processes()
        assert self._exits is not None  # started
        exited = self._exits.take(now_ns)
        if exited is None:
            self._forget_exited()
        elif exited:
            self._forget(exited)
        return ()

    def _forget(self, exited: list[tuple[int, int]]) -> None:
        """The entries of processes the core saw exit (a thread's sync in flight goes at its
        exit, in the kernel: cuda.bpf.c)."""
        procs = self.bpf["procs"]
        for tgid, tid in exited:
            if tid == tgid:
                with contextlib.suppress(KeyError):  # it never called libcuda
                    del procs[procs.Key(tgid)]
                self.scan.forget(tgid)

    def _forget_exited(self) -> None:
        """A walk of the processes' entries and /proc for those gone."""
        procs = self.bpf["procs"]
        for key in list(procs):
            if not alive(self.paths, key.value):
                del procs[key]
        self.scan.forget_exited()

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
