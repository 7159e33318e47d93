"""A Python process with a thread that has no Python frame: a native thread (from a shared
library built with gcc) that takes a thread state, releases the GIL and spins in C, for the
python_stacks probe's native frames (kernel test and bench)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SPIN_FUNC = "gj_native_spin"  # the C function the thread spins in
LIB_NAME = "libgjspin.so"

# Takes a thread state once (as a C extension's worker does to call back into Python).
LIB_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>
#include <sys/syscall.h>
extern int PyGILState_Ensure(void);
extern void *PyEval_SaveThread(void);
static volatile unsigned long sink;
volatile int spinner_tid;
__attribute__((noinline)) void gj_native_spin(void)
{
    for (;;)
        sink++;
}
static void *run(void *arg)
{
    PyGILState_Ensure();
    PyEval_SaveThread();
    spinner_tid = syscall(SYS_gettid);
    gj_native_spin();
    return arg;
}
int start_spinner(void)
{
    pthread_t t;
    return pthread_create(&t, 0, run, 0);
}
"""

# Starts the spinner, prints its thread id, and sleeps in its main thread.
JOB = """
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.start_spinner()
tid = ctypes.c_int.in_dll(lib, "spinner_tid")
while not tid.value:
    time.sleep(0.01)
print(tid.value, flush=True)
time.sleep(600)
"""


def build(where: Path) -> Path:
    """The library, compiled into directory `where`."""
    src, lib = where / "gjspin.c", where / LIB_NAME
    src.write_text(LIB_SOURCE)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src), "-lpthread"],
                   check=True)  # fmt: skip
    return lib


def start(lib: Path, python: str = "/usr/bin/python3.11") -> tuple[subprocess.Popen[str], int]:
    """The process running the spinner from `lib`, and the spinning thread's id (kill the
    process when done)."""
    proc = subprocess.Popen([python, "-c", JOB, str(lib)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip():
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the native spinner did not start under {python}")
    return proc, int(line)
