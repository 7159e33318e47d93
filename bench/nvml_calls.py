"""What one NVML read costs the calling thread, per way of calling it: pynvml's wrappers of
nvmlDeviceGetSamples and nvmlDeviceGetProcessUtilization ask the driver twice (once for a
size, then for the samples), the same functions called once into a buffer kept between
calls, and the size query alone; and the compute-process list as the sampler reads it every
2 s (pynvml's nvmlDeviceGetComputeRunningProcesses). CPU time of this thread (the daemon's
NVML thread pays it) and wall time per call, medians over interleaved rounds; needs a GPU.

Then the daemon's sampler itself (probes/gpu.py) on a thread of its own for --sampler-seconds
after its first read, every NVML call timed in thread CPU by function: what its reads cost
at its cadences (a ring read then returns only the samples since the last one, not the whole
ring as above) against the thread's whole CPU (the rest is the Python around them). Run it
beside a GPU job: the process lists are the job's then.

    python3 -m bench.nvml_calls [--calls 200] [--rounds 5] [--sampler-seconds 20] [--json]
"""

from __future__ import annotations

import argparse
import ctypes as ct
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

SAMPLE_TYPES = {"power": 0, "util": 1}
KINDS = {code: kind for kind, code in SAMPLE_TYPES.items()}


def _timed(call: Callable[[], object], n: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of `call`, over n calls."""
    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
    for _ in range(n):
        call()
    return (time.thread_time_ns() - c0) / n / 1e3, (time.perf_counter_ns() - w0) / n / 1e3


def ways(nv: Any, handle: Any) -> dict[str, Callable[[], object]]:
    """Each way of reading, by name; the raw ones through pynvml's own function pointers."""
    samples = nv._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
    procs = nv._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    out: dict[str, Callable[[], object]] = {}
    for kind, code in SAMPLE_TYPES.items():
        value_type, count = nv._nvmlValueType_t(), ct.c_uint(0)
        samples(handle, nv._nvmlSamplingType_t(code), ct.c_ulonglong(0), ct.byref(value_type),
                ct.byref(count), None)  # fmt: skip
        kept = (nv.c_nvmlSample_t * count.value)()
        ring = count.value

        def size_only(code: int = code) -> object:
            n = ct.c_uint(0)
            return samples(handle, nv._nvmlSamplingType_t(code), ct.c_ulonglong(0),
                           ct.byref(nv._nvmlValueType_t()), ct.byref(n), None)  # fmt: skip

        def into_kept(code: int = code, kept: Any = kept, ring: int = ring) -> object:
            n = ct.c_uint(ring)
            return samples(handle, nv._nvmlSamplingType_t(code), ct.c_ulonglong(0),
                           ct.byref(nv._nvmlValueType_t()), ct.byref(n), kept)  # fmt: skip

        out[f"{kind}: pynvml (size, then samples)"] = lambda code=code: nv.nvmlDeviceGetSamples(
            handle, code, 0
        )
        out[f"{kind}: size query alone"] = size_only
        out[f"{kind}: once, into a kept buffer of {ring}"] = into_kept
    kept_procs = (nv.c_nvmlProcessUtilizationSample_t * 64)()

    def procs_once() -> object:
        n = ct.c_uint(64)
        return procs(handle, kept_procs, ct.byref(n), ct.c_ulonglong(0))

    out["processes: pynvml (size, then samples)"] = lambda: _procs(nv, handle)
    out["processes: once, into a kept buffer of 64"] = procs_once
    out["compute processes: pynvml (as the sampler)"] = lambda: (
        nv.nvmlDeviceGetComputeRunningProcesses(handle)
    )
    return out


def _procs(nv: Any, handle: Any) -> object:
    try:
        return nv.nvmlDeviceGetProcessUtilization(handle, 0)
    except nv.NVMLError:  # no process sampled yet: the driver says NOT_FOUND
        return None


def sampler_cost(seconds: float) -> dict[str, Any]:
    """The sampler as the daemon runs it, on a thread of its own for `seconds` after its first
    read: per NVML function (ring reads by kind) its calls and thread CPU, and the thread's."""
    from gpujitter.probes.gpu import GpuSampler
    from gpujitter.probes.nvml import open_nvml

    nvml = open_nvml()
    spent: dict[str, list[int]] = {}
    untimed = nvml.try_call

    def timed(fn_name: str, *args: Any, gpu: int | None = None) -> tuple[Any, int]:
        start = time.thread_time_ns()
        try:
            return untimed(fn_name, *args, gpu=gpu)
        finally:
            key = f"{fn_name} {KINDS[args[1]]}" if fn_name == "nvmlDeviceGetSamples" else fn_name
            row = spent.setdefault(key, [0, 0])
            row[0] += 1
            row[1] += time.thread_time_ns() - start

    events = [0]

    def emit(_ev: object) -> None:
        events[0] += 1

    sampler = GpuSampler(nvml, emit, cpu_count=os.cpu_count() or 1)
    result: dict[str, Any] = {}

    def run() -> None:
        sampler.start()  # the first read takes whole rings: not the steady cost
        nvml.try_call = timed  # type: ignore[method-assign]
        cpu0, wall0 = time.thread_time_ns(), time.monotonic()
        sampler.run(lambda: time.monotonic() - wall0 >= seconds)
        # the loop ends at the first poll past `seconds`: rates over what it ran
        result["seconds"] = time.monotonic() - wall0
        result["thread_cpu_ms_per_s"] = (time.thread_time_ns() - cpu0) / 1e6 / result["seconds"]

    try:
        thread = threading.Thread(target=run, name="gpujitter-nvml")
        thread.start()
        thread.join()
    finally:
        nvml.close()
    ran = result["seconds"]
    reads = {k: {"calls": n, "cpu_us_per_call": ns / n / 1e3, "cpu_ms_per_s": ns / 1e6 / ran}
             for k, (n, ns) in sorted(spent.items())}  # fmt: skip
    result["reads"] = reads
    result["reads_ms_per_s"] = sum(r["cpu_ms_per_s"] for r in reads.values())
    result["events_per_s"] = events[0] / ran
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--sampler-seconds",
        type=float,
        default=20.0,
        help="how long to time the sampler itself (0: not at all)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        calls = ways(nv, handle)
        cpu: dict[str, list[float]] = {k: [] for k in calls}
        wall: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                c, w = _timed(call, args.calls)
                cpu[name].append(c)
                wall[name].append(w)
    finally:
        nv.nvmlShutdown()
    rows = {k: {"cpu_us": statistics.median(cpu[k]), "wall_us": statistics.median(wall[k]),
                "cpu_us_range": [min(cpu[k]), max(cpu[k])]} for k in calls}  # fmt: skip
    sampler = sampler_cost(args.sampler_seconds) if args.sampler_seconds > 0 else None
    if args.json:
        print(json.dumps({"ways": rows, "sampler": sampler}, indent=1))
        return
    print(f"{'way':<48} {'CPU µs':>9} {'wall µs':>9}")
    for name, row in rows.items():
        print(f"{name:<48} {row['cpu_us']:9.0f} {row['wall_us']:9.0f}")
    if sampler is not None:
        print(
            f"the sampler over {sampler['seconds']:.0f} s: its thread "
            f"{sampler['thread_cpu_ms_per_s']:.2f} ms of CPU a second, its NVML calls "
            f"{sampler['reads_ms_per_s']:.2f}, {sampler['events_per_s']:.0f} events a second"
        )
        for name, r in sampler["reads"].items():
            print(
                f"  {name:<46} {r['calls']:5} calls {r['cpu_us_per_call']:9.0f} µs "
                f"{r['cpu_ms_per_s']:6.2f} ms/s"
            )


if __name__ == "__main__":
    main()
