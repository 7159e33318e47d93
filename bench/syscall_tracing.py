"""What the malloc probe's cheap mode costs processes it does not watch, against the system-call
tracepoints it used before: an enabled syscalls:sys_enter_X tracepoint sends every system call
of every task down the kernel's slow, traced path; the mmap_lock raw tracepoints it uses now
run only where a task takes or releases its mm's lock (mmap, munmap, brk, ...).

Modes, interleaved in each round: nothing attached; an empty program on sys_enter_mmap (the
old cheap mode's hook, without its work); empty programs at the entry and return of libc's
mmap and munmap (the uprobe route, not taken: its hooks alone); the malloc probe as it runs
by default, with the loop unwatched and then watched. Loops (a C program): getppid() (any
system call) and a 4 KiB mmap+munmap pair (calls that take the lock). Each loop runs in
batches and reports its 10th percentile batch, so that another task's time slice on the
shared CPUs does not count.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.syscall_tracing [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
    long batches = 200, n = atol(argv[2]); long long t[200]; char c;
    if (read(0, &c, 1) != 1) return 1;  /* watched (or not) before its first call */
    for (long k = 0; k < batches; k++) {
        long long t0 = now();
        for (long i = 0; i < n; i++) {
            if (argv[1][0] == 'g') { syscall(SYS_getppid); continue; }
            void *p = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            munmap(p, 4096); }
        t[k] = now() - t0; }
    qsort(t, batches, sizeof(t[0]), cmp);
    printf("%.1f\n", (double)t[batches / 10] / n); return 0; }
"""
LOOPS = {"getppid": ("g", "5000"), "mmap_munmap": ("m", "300")}
EMPTY = "TRACEPOINT_PROBE(syscalls, sys_enter_mmap) { return 0; }"
COMM = "gjs-loop"


Refresh = Callable[[], None]  # called once the loop is started, before it begins


def nothing() -> None:
    return None


@contextlib.contextmanager
def untraced() -> Iterator[Refresh]:
    yield nothing


@contextlib.contextmanager
def syscall_tracepoint() -> Iterator[Refresh]:
    from bcc import BPF

    bpf = BPF(text=EMPTY)
    try:
        yield nothing
    finally:
        bpf.cleanup()


@contextlib.contextmanager
def libc_uprobes() -> Iterator[Refresh]:
    from bcc import BPF

    bpf = BPF(text="int hit(void *ctx) { return 0; }")
    try:
        for symbol in ("mmap", "munmap"):
            bpf.attach_uprobe(name="c", sym=symbol, fn_name="hit")
            bpf.attach_uretprobe(name="c", sym=symbol, fn_name="hit")
        yield nothing
    finally:
        bpf.cleanup()


@contextlib.contextmanager
def malloc_probe(watched: bool) -> Iterator[Refresh]:
    watch = WatchSpec(comms=[COMM if watched else "gjs-nobody"])
    with ProbeSet(["malloc"], topology=load_topology(nvml=False), watch=watch,
                  emit=lambda ev: True) as probes:  # fmt: skip
        probes.start()
        yield lambda: probes.core.refresh(time.monotonic_ns())


MODES: dict[str, Callable[[], contextlib.AbstractContextManager[Refresh]]] = {
    "untraced": untraced,
    "syscall_tracepoint": syscall_tracepoint,
    "libc_uprobes": libc_uprobes,
    "malloc_unwatched": lambda: malloc_probe(False),
    "malloc_watched": lambda: malloc_probe(True),
}


def measure(rounds: int) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {m: {w: [] for w in LOOPS} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / f"{COMM}.c", Path(tmp) / COMM
        src.write_text(LOOP)
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(src)], check=True)
        for _ in range(rounds):
            for mode, attached in MODES.items():
                with attached() as refresh:
                    for loop, (arg, n) in LOOPS.items():
                        proc = subprocess.Popen([binary, arg, n], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, text=True)  # fmt: skip
                        refresh()
                        stdout, _ = proc.communicate("g")
                        out[mode][loop].append(float(stdout))
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
    for mode, loops in r.items():
        print(f"{mode:19} " + "  ".join(
            f"{loop} {statistics.median(v):.0f} ns ({min(v):.0f}..{max(v):.0f})"
            for loop, v in loops.items()
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
