"""A scripted feeding loop for the stub libcuda, run as its own process
(`python -m gpujitter.daemon.drill.schedule LIB SCHEDULE`): loads the stub (so that it shows
in /proc/PID/maps like a real libcuda), waits for a line on stdin, then runs a schedule of
CUDA calls and host pauses and prints what really happened (pause start/end, sync
start/end, CLOCK_MONOTONIC ns) as one JSON line. The probe and daemon tests drive it; the
drills' steady loop (feeder.py) calls the stub the same way (`caller`).

Schedule (JSON list): ["call", FUNC, WORK_US, COUNT] calls an entry point COUNT times, each
enqueuing WORK_US of simulated GPU time (syncs ignore it); ["pause", MS] sleeps on the host;
["thread", [OPS...]] runs OPS on a new thread; ["join"] waits for those threads.
"""

from __future__ import annotations

import ctypes as ct
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class LaunchConfig(ct.Structure):
    _fields_ = [(n, ct.c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shmem")] + [
        ("stream", ct.c_void_p)
    ]


def caller(lib: ct.CDLL, name: str) -> Callable[[int], int]:
    fn = getattr(lib, name)
    if name.startswith(("cuLaunchKernelEx",)):
        return lambda us: fn(ct.byref(LaunchConfig(us, 1, 1, 1, 1, 1, 0, None)), None, None, None)
    if name.startswith(("cuLaunchKernel", "cuLaunchCooperativeKernel")) and "Multi" not in name:
        return lambda us: fn(None, us, 1, 1, 1, 1, 1, 0, None, None, None)
    if name == "cuLaunchCooperativeKernelMultiDevice":
        return lambda us: fn(None, us, 0)
    if name.startswith("cuLaunchHostFunc"):
        return lambda us: fn(None, None, ct.c_void_p(us))
    if name.startswith("cuGraphLaunch"):
        return lambda us: fn(ct.c_void_p(us), None)
    if name.startswith(("cuMemcpy2DAsync", "cuMemcpy3DAsync")):
        return lambda us: fn(ct.c_void_p(us * 1000), None)
    if name.startswith("cuMemcpyPeerAsync"):
        return lambda us: fn(
            ct.c_ulonglong(0), None, ct.c_ulonglong(0), None, ct.c_size_t(us * 1000), None
        )
    if name.startswith("cuMemcpyBatchAsync"):
        return lambda us: fn(
            None, None, (ct.c_size_t * 1)(us * 1000), ct.c_size_t(1), None, None, 0, None, None
        )
    if name.startswith(("cuMemcpy", "cuMemset")) and "Async" in name:
        return lambda us: fn(ct.c_ulonglong(0), ct.c_ulonglong(0), ct.c_size_t(us * 1000), None)
    if name.startswith("cuMemcpy"):
        return lambda us: fn(ct.c_ulonglong(0), ct.c_ulonglong(0), ct.c_size_t(us * 1000))
    if name == "cuCtxSynchronize":
        return lambda us: fn()
    return lambda us: fn(None)  # cuCtxSynchronize_v2, cuStreamSynchronize*, cuEventSynchronize


def run(lib: ct.CDLL, ops: list[Any], log: list[dict[str, Any]], threads: list[Any]) -> None:
    for op in ops:
        if op[0] == "call":
            _, name, work_us, count = op
            call = caller(lib, name)
            t0 = time.monotonic_ns()
            for _ in range(count):
                call(work_us)
            log.append({"op": "call", "func": name, "t0": t0, "t1": time.monotonic_ns()})
        elif op[0] == "pause":
            t0 = time.monotonic_ns()
            time.sleep(op[1] / 1000)
            log.append({"op": "pause", "t0": t0, "t1": time.monotonic_ns()})
        elif op[0] == "thread":
            t = threading.Thread(target=run, args=(lib, op[1], log, threads))
            t.start()
            threads.append(t)
        elif op[0] == "join":
            for t in threads:
                t.join()


def main() -> None:
    lib = ct.CDLL(sys.argv[1])
    schedule = json.loads(sys.argv[2])
    sys.stdin.readline()
    log: list[dict[str, Any]] = []
    run(lib, schedule, log, [])
    print(json.dumps(log), flush=True)


if __name__ == "__main__":
    main()
