"""Cost of the malloc probe's precise mode (uprobes on the allocator, opt-in and bounded):
what one uprobe hit costs at a function's first byte when that byte starts endbr64 (a CET
build) and 4 bytes in, past it; and an allocation-heavy loop (glibc malloc/free pairs)
with precise mode on against off. Figures are medians of rounds within one run.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.malloc_precise [--json]

The workload is a small C program built here whose probed functions start with endbr64, as
the GPU machine's glibc does (this machine's does not).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpujitter.probes.elf import ElfFile
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

# `loop MODE N`: waits for a line on stdin (so probes attach first), runs N iterations and
# prints the nanoseconds per iteration. push, mov: one call of a function that starts with
# endbr64 followed by a push (as glibc's malloc does in CET builds; the kernel emulates a
# probed push) or by a mov (which the kernel must single-step); alloc: one glibc malloc(64)
# and free.
LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__asm__(".text\n"
        ".globl fn_push\n.type fn_push, @function\n"
        "fn_push: endbr64\n push %rbx\n lea 1(%rdi), %rax\n pop %rbx\n ret\n"
        ".size fn_push, .-fn_push\n"
        ".globl fn_mov\n.type fn_mov, @function\n"
        "fn_mov: endbr64\n mov %rdi, %rax\n add $1, %rax\n ret\n"
        ".size fn_mov, .-fn_mov\n");
unsigned long fn_push(unsigned long x);
unsigned long fn_mov(unsigned long x);

int main(int argc, char **argv)
{
    long n = atol(argv[2]);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    struct timespec a, b;
    unsigned long sink = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        if (argv[1][0] == 'a') {
            void *p = malloc(64);
            __asm__ volatile("" : : "r"(p) : "memory");
            free(p);
        } else if (argv[1][0] == 'p') {
            sink += fn_push(i);
        } else {
            sink += fn_mov(i);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.2f %lu\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n, sink);
    return 0;
}
"""

HIT = "int hit(void *ctx) { return 0; }"


class Loop:
    def __init__(self, exe: Path, mode: str, n: int) -> None:
        self.proc = subprocess.Popen(
            [str(exe), mode, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self) -> float:
        out, _ = self.proc.communicate("go\n", timeout=600)
        return float(out.split()[0])


def build(directory: Path) -> Path:
    src, exe = directory / "loop.c", directory / "loop"
    src.write_text(LOOP)
    cc = shutil.which("cc") or shutil.which("gcc-12") or "gcc"
    subprocess.run([cc, "-O2", "-fcf-protection=full", "-o", str(exe), str(src)], check=True)
    return exe


def rounds(n: int, once: Callable[[], float]) -> float:
    return statistics.median(once() for _ in range(n))


def uprobe_round(exe: Path, fn: str, n: int, offsets: tuple[int, ...], ret: bool) -> float:
    """One loop of calls of fn_<fn> with a do-nothing BPF program at each offset."""
    from bcc import BPF

    loop = Loop(exe, fn, n)
    addr = ElfFile(exe).functions({f"fn_{fn}"})[f"fn_{fn}"]
    bpf = BPF(text=HIT) if offsets else None
    for off in offsets:
        assert bpf is not None
        bpf.attach_uprobe(name=str(exe), addr=addr + off, fn_name="hit", pid=loop.proc.pid)
        if ret:
            bpf.attach_uretprobe(name=str(exe), addr=addr + off, fn_name="hit", pid=loop.proc.pid)
    try:
        return loop.run()
    finally:
        if bpf is not None:
            bpf.cleanup()


def precise_round(exe: Path, n: int, on: bool) -> float:
    """One loop of malloc/free pairs, with precise mode timing both (threshold out of
    reach: every call is timed in the kernel, none is streamed)."""
    loop = Loop(exe, "alloc", n)
    if not on:
        return loop.run()
    pid = loop.proc.pid
    with ProbeSet(
        ["malloc"],
        topology=load_topology(),
        watch=WatchSpec(pids={pid}),
        emit=lambda ev: True,
        thresholds={"malloc": {"call": 10**12}},
        options={"malloc": {"precise_pids": [pid], "precise_window_ns": 600 * 10**9}},
    ) as probes:
        statuses = probes.start()
        assert "precise mode for" in statuses[0].reason, statuses[0].reason
        return loop.run()


def measure(n_calls: int, n_allocs: int, n_rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        elf = ElfFile(exe)
        for fn, addr in elf.functions({"fn_push", "fn_mov"}).items():
            assert elf.entry_skip(addr) == 4, f"{fn} should start with endbr64"

        def calls(fn: str, offsets: tuple[int, ...], ret: bool = False) -> float:
            return rounds(n_rounds, lambda: uprobe_round(exe, fn, n_calls, offsets, ret))

        per_call = {
            "no probe": calls("push", ()),
            "uprobe at symbol (endbr64)": calls("push", (0,)),
            "uprobe at +4 (a push)": calls("push", (4,)),
            "uprobe at +4 (a mov)": calls("mov", (4,)),
            "uprobe + uretprobe at +4 (a push)": calls("push", (4,), ret=True),
        }
        allocs = {
            "off": rounds(n_rounds, lambda: precise_round(exe, n_allocs, False)),
            "precise mode": rounds(n_rounds, lambda: precise_round(exe, n_allocs, True)),
        }
    base = per_call["no probe"]
    return {
        "ns_per_call": per_call,
        "ns_per_hit": {k: round(v - base, 1) for k, v in per_call.items() if k != "no probe"},
        "ns_per_malloc_free_pair": allocs,
        "precise_slowdown": round(allocs["precise mode"] / allocs["off"], 2),
        "precise_ns_per_timed_call": round((allocs["precise mode"] - allocs["off"]) / 2, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000, help="calls per uprobe round")
    parser.add_argument("--allocs", type=int, default=100_000, help="malloc/free pairs per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.calls, args.allocs, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for what, ns in result["ns_per_call"].items():
        hit = result["ns_per_hit"].get(what)
        print(f"{what:36s} {ns:9.1f} ns/call" + (f"   {hit:9.1f} ns/hit" if hit else ""))
    for what, ns in result["ns_per_malloc_free_pair"].items():
        print(f"malloc+free, precise mode {what:10s} {ns:9.1f} ns/pair")
    print(
        f"precise mode: x{result['precise_slowdown']} on malloc/free pairs, "
        f"{result['precise_ns_per_timed_call']} ns per timed call"
    )


if __name__ == "__main__":
    main()
