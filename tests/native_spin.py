"""Threads with no Python frame, built with gcc, for the python_stacks probe's native frames
(kernel tests and bench): in a Python process, a native thread (from a shared library) that
takes a thread state, releases the GIL and spins in C; and a process with no Python in it at
all, whose two threads spin in C functions of their own."""

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


# A program with no interpreter: two threads spinning in C (no thread state anywhere), the
# feeder-to-be alone with an argument; prints their thread ids, "FEEDER OTHER" (0: none),
# then waits to be killed.
FEEDER_FUNC, OTHER_FUNC = "gj_feeder_spin", "gj_other_spin"
PROGRAM_NAME = "gjnative"
PROGRAM_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
static volatile unsigned long sink;
static volatile int tids[2];
__attribute__((noinline)) void gj_feeder_spin(void)
{
    for (;;)
        sink++;
}
__attribute__((noinline)) void gj_other_spin(void)
{
    for (;;)
        sink += 3;
}
static void *run(void *which)
{
    tids[which != 0] = syscall(SYS_gettid);
    if (which)
        gj_other_spin();
    gj_feeder_spin();
    return which;
}
int main(int argc, char **argv)
{
    pthread_t t;
    int other = argc < 2;
    pthread_create(&t, 0, run, 0);
    if (other)
        pthread_create(&t, 0, run, (void *)1);
    while (!tids[0] || (other && !tids[1]))
        usleep(1000);
    printf("%d %d\n", tids[0], tids[1]);
    fflush(stdout);
    for (;;)
        pause();
}
"""


def _compile(where: Path, name: str, source: str, *flags: str) -> Path:
    """`source` compiled with gcc into `where`/`name`."""
    src, out = where / f"{name}.c", where / name
    src.write_text(source)
    subprocess.run(["gcc", "-O1", *flags, "-o", str(out), str(src), "-lpthread"], check=True)
    return out


def build(where: Path) -> Path:
    """The library, compiled into directory `where`."""
    return _compile(where, LIB_NAME, LIB_SOURCE, "-shared", "-fPIC")


def build_program(where: Path) -> Path:
    """The program with no interpreter, compiled into directory `where`."""
    return _compile(where, PROGRAM_NAME, PROGRAM_SOURCE)


def start_program(exe: Path, alone: bool = False) -> tuple[subprocess.Popen[str], int, int]:
    """The program running, with its feeder-to-be's and its other thread's ids (alone: no
    other thread, id 0; kill the process when done)."""
    proc = subprocess.Popen([str(exe), *(["alone"] if alone else [])], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None
    feeder, other = (int(t) for t in proc.stdout.readline().split())
    return proc, feeder, other


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
