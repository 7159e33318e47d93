"""What naming native frames costs the daemon's probe thread (probes/native_names.py): this
process maps a large library (libLLVM's symbol table standing in for libtorch's on a training
job, or a generated file of --synthetic N mangled C++ functions, libtorch_cpu's count) and a
page of anonymous code (JIT, trampolines), and names 100 sampled addresses a simulated second,
a tenth of them in the anonymous page and the rest at random in the library's code, through
the process symbols python_stacks uses. Reports the CPU seconds it took per simulated second,
the one read of the library's table within them (CPU seconds) and the memory its functions
are kept in (the rise of this process's anonymous resident memory over that read).

    .venv/bin/python -m bench.native_names_cost --seconds 50
    .venv/bin/python -m bench.native_names_cost --synthetic 300000
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import random
import tempfile
import time
from pathlib import Path

from bench.synthetic_elf import mangled, write_elf
from gpujitter.probes.host import HostPaths
from gpujitter.probes.native_names import NativeNames
from gpujitter.probes.procfs import in_root, read_maps

SAMPLES_PER_S = 100
ANON_EVERY = 10  # one sample in ten lands in the anonymous code
SYNTHETIC_SPACING = 64  # bytes from one generated function to the next (48 of code each)


def anon_resident_bytes() -> int:
    """This process's anonymous resident memory (what a table kept in it adds)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def map_synthetic(count: int, folder: Path) -> tuple[str, mmap.mmap]:
    """A generated ELF of `count` mangled functions, mapped executable (as the dynamic
    loader maps a library's code): its path and the mapping."""
    path = write_elf(folder / "libsynthetic.so", ((0x10000 + SYNTHETIC_SPACING * i, 48,
                                                   mangled(i)) for i in range(count)))  # fmt: skip
    with open(path, "rb") as f:
        return str(path), mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=50, help="simulated seconds of samples")
    p.add_argument("--no-anon", action="store_true", help="no sample in anonymous code")
    p.add_argument("--library", default="LLVM-15", help="the large library to map (ctypes name)")
    p.add_argument("--synthetic", type=int, metavar="N",
                   help="map a generated file of N mangled functions instead")  # fmt: skip
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.synthetic:
            library, _mapped = map_synthetic(args.synthetic, Path(folder))
        else:
            library = args.library
            ctypes.CDLL(ctypes.util.find_library(library) or f"lib{library}.so.1")
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        anon = ctypes.addressof(ctypes.c_char.from_buffer(page))
        pid = os.getpid()
        code = [m for m in read_maps(HostPaths(), pid) if library in m.path and m.executable]
        # The one read of the table, as the first sample in the library makes it (the
        # samples below find it kept, by the file's identity).
        names, now_ns = NativeNames(), 0
        anon0, cpu0 = anon_resident_bytes(), time.process_time()
        functions = names.files.of(in_root(HostPaths(), pid, code[0].path))
        load_cpu_s = time.process_time() - cpu0
        kept_mb = (anon_resident_bytes() - anon0) / 1e6
        rng = random.Random(1)
        cpu0 = time.process_time()
        for i in range(args.seconds * SAMPLES_PER_S):
            now_ns += 1_000_000_000 // SAMPLES_PER_S
            in_anon = not args.no_anon and i % ANON_EVERY == 0
            names.name(pid, anon if in_anon else rng.randrange(code[0].start, code[0].end), now_ns)
        cpu_s = time.process_time() - cpu0 + load_cpu_s
        names.close()
    print(json.dumps({
        "library": os.path.basename(code[0].path), "simulated_s": args.seconds,
        "cpu_s": round(cpu_s, 3), "cpu_pct": round(100 * cpu_s / args.seconds, 2),
        "anon": not args.no_anon, "functions": len(functions.starts),
        "load_cpu_s": round(load_cpu_s, 3), "kept_mb": round(kept_mb, 1),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
