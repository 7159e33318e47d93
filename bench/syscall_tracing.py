"""What a syscalls:sys_enter_X tracepoint with a BPF program costs every other system call of
the node (the malloc probe's cheap mode attaches ten): the kernel then sends every task's
system calls down its slow, traced path. Times a loop of getppid() with no program attached
and with an empty one on sys_enter_mmap, interleaved, and prints ns per call.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.syscall_tracing [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

LOOP = r"""
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
int main(void) { struct timespec a, b; long n = 2000000;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) syscall(SYS_getppid);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n); return 0; }
"""
EMPTY = "TRACEPOINT_PROBE(syscalls, sys_enter_mmap) { return 0; }"


def measure(rounds: int) -> dict[str, list[float]]:
    from bcc import BPF

    out: dict[str, list[float]] = {"untraced_ns": [], "traced_ns": []}
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / "gjs-loop.c", Path(tmp) / "gjs-loop"
        src.write_text(LOOP)
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(src)], check=True)

        def per_call_ns() -> float:
            return float(subprocess.run([binary], capture_output=True, text=True).stdout)

        for _ in range(rounds):
            out["untraced_ns"].append(per_call_ns())
            bpf = BPF(text=EMPTY)
            try:
                out["traced_ns"].append(per_call_ns())
            finally:
                bpf.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = measure(args.rounds)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    for mode, values in r.items():
        print(f"{mode}: median {statistics.median(values):.1f} ns per getppid() "
              f"({min(values):.1f}..{max(values):.1f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
