"""Helper processes of the drills, started by the drill (never by the watched feeder, whose
children the probes would watch too) and woken by the feeder through a pipe that carries
each stall's deadline (8 bytes, CLOCK_MONOTONIC ns):

    python -m gpujitter.daemon.drill.helpers hog FD CPU POLICY [SPAN_MS]
        on CPU (the feeder's), spins until each deadline, so that the feeder waits on the
        run queue (contention): POLICY fifo (SCHED_FIFO: the feeder runs not at all until
        the deadline) or nice (nice -20 where real-time is refused: the feeder still gets
        about 1 % of the CPU, in the scheduler's slices). With SPAN_MS it sleeps until
        SPAN_MS before each deadline first (sync-contention: it lands while the feeder
        waits in a synchronisation); without, it spins from the feeder's wake-up (contention,
        sync-late).
    python -m gpujitter.daemon.drill.helpers io FD FILE THREADS CPUS
        page-sized O_DIRECT reads of FILE from THREADS threads on CPUS (a list, away from
        the feeder) until each deadline: the disk's interrupts land wherever its IRQ is
        routed (irq).

They run until the pipe closes, and die with the drill's process (die_with_parent), as the
feeding loop and its loader worker do."""

from __future__ import annotations

import ctypes as ct
import mmap
import os
import signal
import struct
import sys
import threading
import time

from gpujitter.probes.host import parse_cpulist

PAGE = mmap.PAGESIZE
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
# The drill's pid, in the environment of the processes it starts (child_env)
PARENT_ENV = "GPUJITTER_DRILL_PARENT"


def child_env() -> dict[str, str]:
    """The environment of a process the drill starts: this process named its parent."""
    return {**os.environ, PARENT_ENV: str(os.getpid())}


def die_with_parent(parent: int = 0) -> None:
    """This process killed when its parent (the pid given, else the drill's from child_env)
    ends, however it ends. The drill stops its children on every way out it sees, but not
    when it is killed outright (SIGKILL, the OOM killer), and the loader's worker is the
    feeding loop's child, which the drill SIGKILLs: a worker left behind held its CPU
    pinning, memory and pipes for good (`drill loader` stopped by SIGINT or SIGTERM, 4 times
    in 7, 2026-12-05)."""
    parent = parent or int(os.environ.get(PARENT_ENV, "0"))
    ct.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent and os.getppid() != parent:  # it had ended before the request took hold
        os._exit(1)


def leave_interrupts_to_the_drill() -> None:
    """Ctrl-C ignored (SIGINT; a fork inherits this): a terminal sends it to the drill's
    whole process group, and the drill stops its children itself once it has put back what
    it changed. Taken here too, it only printed a KeyboardInterrupt traceback from wherever
    the process was."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def deadlines(fd: int):
    """Each deadline the feeder sends, until it closes its end."""
    while True:
        data = os.read(fd, 8)
        if len(data) < 8:
            return
        yield struct.unpack("<Q", data)[0]


def hog(fd: int, cpu: int, policy: str, span_ns: int | None) -> None:
    os.sched_setaffinity(0, {cpu})
    if policy == "fifo":
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    else:
        os.setpriority(os.PRIO_PROCESS, 0, -20)
    for deadline in deadlines(fd):
        if span_ns is not None:
            time.sleep(max(0, deadline - span_ns - time.monotonic_ns()) / 1e9)
        while time.monotonic_ns() < deadline:
            pass


def io(fd: int, path: str, threads: int, cpus: list[int]) -> None:
    os.sched_setaffinity(0, cpus)
    until = [0]
    wake = threading.Condition()

    def reader(seed: int) -> None:
        f = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, PAGE)  # page-aligned, as O_DIRECT wants
        pages = max(1, os.fstat(f).st_size // PAGE)
        i = seed
        while True:
            with wake:
                wake.wait_for(lambda: time.monotonic_ns() < until[0])
            while time.monotonic_ns() < until[0]:
                i = (i * 1103515245 + 12345) % (1 << 31)
                os.preadv(f, [buf], (i % pages) * PAGE)

    for n in range(threads):
        threading.Thread(target=reader, args=(n + 1,), daemon=True).start()
    for deadline in deadlines(fd):
        with wake:
            until[0] = deadline
            wake.notify_all()


def main() -> None:
    die_with_parent()
    leave_interrupts_to_the_drill()
    role, fd = sys.argv[1], int(sys.argv[2])
    # A name of its own, so that attributions name the helper (comm), not "python3".
    ct.CDLL(None).prctl(PR_SET_NAME, f"gj-drill-{role}".encode(), 0, 0, 0)
    if role == "hog":
        span = round(float(sys.argv[5]) * 1e6) if len(sys.argv) > 5 else None
        hog(fd, int(sys.argv[3]), sys.argv[4], span)
    elif role == "io":
        io(fd, sys.argv[3], int(sys.argv[4]), parse_cpulist(sys.argv[5]))
    else:
        sys.exit(f"unknown helper {role!r}")


if __name__ == "__main__":
    main()
