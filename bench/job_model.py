"""A stand-in for a training job's process tree where torch is not installed, for the daemon's
own CPU (bench/daemon_cpu.py live --pid): a Python parent with many threads and hundreds of
mapped shared libraries, feeding the drills' stub libcuda in a loop, and forked worker
processes that share its maps.

    .venv/bin/python -m bench.job_model [--libs 400] [--threads 40] [--workers 4] [--tickers 0]
        [--seconds 600]

The libraries are mapped read+exec from their files (no constructors run), one mapping per
file, which is what a scan of /proc/PID/maps meets in a libtorch process (hundreds of files).
The parent steps at ~24 steps a second: 20 ms of Python work, then 10 ms of simulated kernels
launched on the stub and a synchronisation that sleeps until they drain (the drills' stub
feeder's step); its other threads wait in 1 s sleeps, as a framework's idle pools do; each
worker works 5 ms every 40 ms. --tickers adds processes that each work ~3 ms every 100 ms.
It prints its pid, then runs until --seconds pass or it is killed (workers die with it).
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import sys
import threading
import time
from pathlib import Path

from gpujitter.daemon.drill.build import cached_stub
from gpujitter.daemon.drill.feeder import FeederConfig, StubGpu

LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib/x86_64-linux-gnu")


def map_libraries(count: int) -> list[mmap.mmap]:
    """Up to `count` shared libraries mapped read+exec (kept alive by the returned list)."""
    maps: list[mmap.mmap] = []
    seen: set[tuple[int, int]] = set()
    for folder in LIB_DIRS:
        for path in sorted(Path(folder).glob("*.so*")):
            if len(maps) >= count:
                return maps
            try:
                st = path.stat()
                if (st.st_dev, st.st_ino) in seen or st.st_size < 4096:
                    continue
                with path.open("rb") as f:
                    maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC))
                seen.add((st.st_dev, st.st_ino))
            except (OSError, ValueError):
                continue
    return maps


def busy(seconds: float) -> int:
    """Python work for `seconds` of wall time."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(i * i for i in range(200))
    return n


def pool_thread(stop: threading.Event) -> None:
    while not stop.wait(1.0):
        pass


def worker(stop_at: float) -> None:
    """A DataLoader worker: 5 ms of work every 40 ms, two threads of its own."""
    stop = threading.Event()
    for _ in range(2):
        threading.Thread(target=pool_thread, args=(stop,), daemon=True).start()
    while time.monotonic() < stop_at and os.getppid() != 1:
        busy(0.005)
        time.sleep(0.035)
    os._exit(0)


def ticker(stop_at: float) -> None:
    """A process of the job that runs briefly: ~3 ms every 100 ms, about one timer tick (at
    HZ=250) in each of the irq probe's 100 ms windows. Beside the H200's training job most
    windows made were such single ticks (~400 a second made, ~41 past the 10 µs threshold);
    the default model's are mostly its busy main thread's, past it."""
    while time.monotonic() < stop_at and os.getppid() != 1:
        busy(0.003)
        time.sleep(0.097)
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libs", type=int, default=400)
    parser.add_argument("--threads", type=int, default=40)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tickers", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    stop_at = time.monotonic() + args.seconds
    maps = map_libraries(args.libs)
    stub = str(cached_stub())
    gpu = StubGpu(FeederConfig(backend="stub", inject_lib="", scenario="clean", cpu=-1,
                               duration_s=args.seconds, stall_ms=0.0, stub=stub))  # fmt: skip
    workers = []
    for run in [worker] * args.workers + [ticker] * args.tickers:
        pid = os.fork()
        if pid == 0:
            run(stop_at)
        workers.append(pid)
    stop = threading.Event()
    for _ in range(args.threads):
        threading.Thread(target=pool_thread, args=(stop,), daemon=True).start()
    print(os.getpid(), len(maps), flush=True)
    try:
        while time.monotonic() < stop_at:
            busy(0.020)
            gpu.step()
            gpu.sync()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    sys.exit(0)


if __name__ == "__main__":
    main()
