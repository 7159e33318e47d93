"""python_gil: waits of watched threads to take CPython's GIL, with the thread that held it
(the one that took it last before the waiter did; python_gil.bpf.c).

Where: the interpreter each watched process runs (a `python3.X` executable or the
`libpython3.X.so` it loads), found in /proc/PID/maps as the python_gc probe finds it and
attached once per distinct file. How: a uprobe and a uretprobe on take_gil, the wait every
re-acquisition goes through (PyEval_RestoreThread's, inlined into callers or not, and the
eval loop's after a forced switch): its symbol where the build keeps one, else the one call
target that PyEval_RestoreThread and PyEval_AcquireThread (exported) share; past an endbr64
where the build is CET-enabled. A file without the interpreter (a launcher linked to
libpython) is passed over. Waits of `wait` (default 1 ms) or more are streamed as GilWait;
the others are counted in a log2 histogram. Cost: two uprobe hits per GIL acquisition,
which PyTorch makes in every operator call: off by default (docs/probes.md has the figures).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujitter.probes.base import ProbeContext, comm_str
from gpujitter.probes.elf import ElfFile
from gpujitter.probes.events import Event, GilWait
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.mapped_scan import file_key
from gpujitter.probes.python_gc import InterpreterProbe, node_interpreter
from gpujitter.probes.registry import Hook, ProbeSpec

TAKER = "take_gil"
# Exported functions whose first call is take_gil, in every CPython 3 build: where take_gil
# is found in a stripped build (the one call target both make).
CALLERS = ("PyEval_RestoreThread", "PyEval_AcquireThread")
CALL_SCAN_BYTES = 48  # how far into a caller its call to take_gil is looked for
NO_GIL_PROBE = "no GIL probe for this interpreter"


@dataclass(frozen=True, slots=True)
class AcquireSite:
    """Where one interpreter file waits for the GIL: take_gil's address as the ELF file gives
    it (what bcc takes; past endbr64: skip 4), how it was found ("symbol", or "calls": the
    call target PyEval_RestoreThread and PyEval_AcquireThread share), or why there is none
    (address -1). launcher: a file that holds no interpreter of its own (its libpython is
    probed)."""

    address: int
    found: str = ""
    skip: int = 0
    why: str = ""
    launcher: bool = False


def call_targets(elf: ElfFile, vaddr: int, span: int = CALL_SCAN_BYTES) -> set[int]:
    """Targets of what may be direct calls (E8 rel32) in the first `span` bytes of the
    function at vaddr that lie in .text (not a PLT stub). Bytes are not decoded into
    instructions, so a target can be spurious; one found in two functions that both call
    take_gil first is not."""
    text = elf.section(".text")
    if text is None:
        return set()
    code = elf.code(vaddr, span + 5)
    out = set()
    for i in range(min(span, len(code) - 4)):
        if code[i] == 0xE8:
            target = vaddr + i + 5 + int.from_bytes(code[i + 1 : i + 5], "little", signed=True)
            if text[3] <= target < text[3] + text[5]:
                out.add(target)
    return out


def acquire_site(path: str | Path) -> AcquireSite:
    """Where to probe the GIL waits of the interpreter in `path`. take_gil, not
    PyEval_RestoreThread: link-time optimisation inlines PyEval_RestoreThread into some of
    its callers (Debian's python3.11: os.stat, reads), but never take_gil's wait loop."""
    try:
        with ElfFile(path) as elf:
            return _acquire_site(elf)
    except (OSError, ValueError, IndexError, struct.error) as err:  # a truncated or odd file
        return AcquireSite(-1, why=f"{NO_GIL_PROBE}: {path}: {err}")


def _acquire_site(elf: ElfFile) -> AcquireSite:
    found = elf.functions({TAKER, *CALLERS, "PyGC_Collect"})
    if TAKER in found:
        address, how = found[TAKER], "symbol"
    elif all(c in found for c in CALLERS):
        common = set.intersection(*(call_targets(elf, found[c]) for c in CALLERS))
        if len(common) != 1:
            return AcquireSite(-1, why=f"{NO_GIL_PROBE}: no {TAKER} symbol, and "
                               f"{' and '.join(CALLERS)} share no one first call")  # fmt: skip
        address, how = common.pop(), "calls"
    elif "PyGC_Collect" not in found:
        return AcquireSite(-1, why="no interpreter here: its libpython has it", launcher=True)
    else:
        return AcquireSite(-1, why=f"{NO_GIL_PROBE}: no {TAKER} symbol nor {CALLERS[0]}")
    skip = elf.entry_skip(address)
    return AcquireSite(address + skip, how, skip)


class PythonGilProbe(InterpreterProbe):
    bpf_file = "python_gil.bpf.c"
    rings = ("gil_events",)
    per_thread = ("gil_waiting", "gil_owner")  # the owner's key is a process id

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self._hist: Log2Map | None = None

    def attach(self, ctx: ProbeContext) -> None:
        self._hist = Log2Map(self.bpf["short_log2"], ["gil.wait"], self.name)
        self.scan_processes()

    def add_interpreter(self, mapped: str, local: str) -> AcquireSite | None:
        """Probe the GIL waits of the interpreter file at `local` (once per file)."""
        key = file_key(local)
        if key is None or key in self.interpreters:
            return None
        site = acquire_site(local)
        if site.address >= 0:
            try:
                self.bpf.attach_uprobe(name=local, addr=site.address, fn_name="gil_enter")
                self.bpf.attach_uretprobe(name=local, addr=site.address, fn_name="gil_leave")
            except Exception as err:  # bcc raises plain Exception; one file never stops the probe
                site = AcquireSite(-1, why=f"{NO_GIL_PROBE}: {err}")
        self.interpreters[key] = (mapped, site)
        return site

    def describe(self, how: Any) -> str | None:
        if how.launcher:
            return None
        if how.address < 0:
            return str(how.why)
        return f"probed at {TAKER} (by {how.found})" + (" past endbr64" if how.skip else "")

    def sample(self, now_ns: int) -> list[Event]:
        self.rescan(now_ns)
        return []

    def log2_maps(self) -> list[Log2Map]:
        return [self._hist] if self._hist is not None else []

    def acquisitions(self) -> int:
        """GIL acquisitions of watched threads seen so far, all durations."""
        table = self.bpf["acquisitions"]
        return int(sum(table[table.Key(0)]))

    def decode(self, ring: str, rec: Any) -> GilWait:
        return GilWait(
            ts_ns=rec.ts_ns,
            dur_ns=rec.dur_ns,
            tid=rec.tid,
            tgid=rec.tgid,
            cpu=rec.cpu,
            holder_tid=rec.holder_tid,
            holder_comm=comm_str(rec.holder_comm) if rec.holder_tid else "",
        )


SPECS = (
    ProbeSpec(
        name="python_gil",
        summary="CPython GIL waits of watched threads and the thread that held the GIL",
        default_on=False,
        hooks=(
            # Judged by doctor in the node's own interpreter; the status names each one met.
            Hook("uprobe", f"{node_interpreter()}:{CALLERS[0]}"),
        ),
        degrades="Python GIL waits are not told apart: they show as blocked (futex)",
        factory=PythonGilProbe,
        thresholds={"wait": 1_000_000},
        off_reason="two uprobe hits on every GIL acquisition (4 µs here), and PyTorch takes "
        "the GIL back after each operator call: too much for a launch-bound loop",
    ),
)
