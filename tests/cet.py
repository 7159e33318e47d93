"""A small program built with Intel CET (-fcf-protection=full), so that its functions start
with endbr64 as the GPU machine's glibc does (this machine's glibc does not): it embeds a
prefixed allocator, as Redis embeds jemalloc (je_malloc, je_calloc, je_free). je_calloc
zeroes a 64 MiB arena, so a large call is genuinely slow. Built with the C compiler that
the kernel headers package brings."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = r"""
#include <stdio.h>
#include <string.h>
#include <time.h>

static char arena[64 << 20];

__attribute__((noinline)) void *je_malloc(unsigned long n) { return n <= sizeof arena ? arena : 0; }

__attribute__((noinline)) void *je_calloc(unsigned long n, unsigned long size)
{
    unsigned long len = n * size;
    if (len > sizeof arena)
        return 0;
    memset(arena, 0, len);
    return arena;
}

__attribute__((noinline)) void je_free(void *p) { (void)p; }

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static unsigned long long cpu_ns(void)  /* this thread's CPU time */
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* Each input line "N SIZE": N timed je_calloc(1, SIZE) calls, one "t0 t1 cpu" line each:
 * the clock around the call, and the thread's CPU time across it (read just outside). */
int main(void)
{
    unsigned long n, size;
    while (scanf("%lu %lu", &n, &size) == 2) {
        for (unsigned long i = 0; i < n; i++) {
            unsigned long long c0 = cpu_ns();
            unsigned long long t0 = now_ns();
            void *p = je_calloc(1, size);
            unsigned long long t1 = now_ns();
            unsigned long long c1 = cpu_ns();
            je_free(p);
            printf("%llu %llu %llu\n", t0, t1, c1 - c0);
        }
        fflush(stdout);
    }
    return 0;
}
"""

FUNCTIONS = ("je_malloc", "je_calloc", "je_free")


def compiler() -> str:
    for name in ("cc", "gcc", "gcc-12"):
        if path := shutil.which(name):
            return path
    raise AssertionError("no C compiler (gcc-12 comes with linux-headers-amd64)")


def build_cet_program(directory: Path) -> Path:
    src = directory / "cet_alloc.c"
    exe = directory / "cet_alloc"
    src.write_text(SOURCE)
    subprocess.run(
        [compiler(), "-O2", "-fcf-protection=full", "-o", str(exe), str(src)], check=True
    )
    return exe
