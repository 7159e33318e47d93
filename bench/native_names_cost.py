"""What naming native frames costs the daemon's probe thread (probes/native_names.py): this
process maps libLLVM (a large symbol table, like libtorch's on a training job) and a page of
anonymous code (JIT, trampolines), and names 100 sampled addresses a simulated second, a
tenth of them in the anonymous page and the rest at random in libLLVM's code, through the
process symbols python_stacks uses. Reports the CPU seconds it took per simulated second.

    .venv/bin/python -m bench.native_names_cost --seconds 50
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import random
import time

from gpujitter.probes.host import HostPaths
from gpujitter.probes.native_names import NativeNames
from gpujitter.probes.procfs import read_maps

SAMPLES_PER_S = 100
ANON_EVERY = 10  # one sample in ten lands in the anonymous code


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=50, help="simulated seconds of samples")
    p.add_argument("--no-anon", action="store_true", help="no sample in anonymous code")
    p.add_argument("--library", default="LLVM-15", help="the large library to map (ctypes name)")
    args = p.parse_args()
    ctypes.CDLL(ctypes.util.find_library(args.library) or f"lib{args.library}.so.1")
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    anon = ctypes.addressof(ctypes.c_char.from_buffer(page))
    code = [m for m in read_maps(HostPaths(), "self") if args.library in m.path and m.executable]
    rng = random.Random(1)
    names, pid, now_ns = NativeNames(), os.getpid(), 0
    cpu0 = time.process_time()
    for i in range(args.seconds * SAMPLES_PER_S):
        now_ns += 1_000_000_000 // SAMPLES_PER_S
        in_anon = not args.no_anon and i % ANON_EVERY == 0
        names.name(pid, anon if in_anon else rng.randrange(code[0].start, code[0].end), now_ns)
    cpu_s = time.process_time() - cpu0
    print(json.dumps({"simulated_s": args.seconds, "cpu_s": round(cpu_s, 3),
                      "cpu_pct": round(100 * cpu_s / args.seconds, 2),
                      "anon": not args.no_anon}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
