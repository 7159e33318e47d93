"""Does NVML stamp a sample with the wall clock of when it was taken, or derive the stamp at
each read from the wall clock of the read? The sampler maps stamps onto CLOCK_MONOTONIC with
the wall clock's offset read at every poll, and asks for the samples newer than the newest
it has seen (docs/gpu.md, "Clock calibration"): which of the two NVML does decides what a
stepped wall clock does to both.

This steps CLOCK_REALTIME back by --step seconds, then forward by as much, while it reads
one GPU's power samples every 100 ms: per read, the newest sample's stamp against the wall
clock and against CLOCK_MONOTONIC (with the offset from before any step), what a read from
the newest stamp seen returns, and the oldest stamp of a whole-ring read. It puts the wall
clock back at the end (from CLOCK_MONOTONIC and the offset it began with). It steps the
node's clock: run it only on a machine lent for it (tools/gpu_session.sh clockstep).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

READ_EVERY_S = 0.1


def _samples(nv: object, handle: object, last_seen_us: int) -> list[int]:
    """The stamps (µs) of the power samples newer than last_seen_us, oldest first."""
    try:
        _, raw = nv.nvmlDeviceGetSamples(handle, nv.NVML_TOTAL_POWER_SAMPLES, last_seen_us)
    except nv.NVMLError_NotFound:
        return []
    return sorted(int(s.timeStamp) for s in raw if int(s.timeStamp) > last_seen_us)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step", type=float, default=5.0, help="seconds to step back, then on")
    ap.add_argument("--seconds", type=float, default=24.0)
    args = ap.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    step_ns = int(args.step * 1e9)
    mono0 = time.monotonic_ns()
    offset0 = time.clock_gettime_ns(time.CLOCK_REALTIME) - mono0
    plan = [(args.seconds / 4, -step_ns), (args.seconds / 2, +step_ns)]  # (at s, by ns)
    last_seen = _samples(nv, handle, 0)[-1]
    rows = []
    try:
        while (elapsed := (time.monotonic_ns() - mono0) / 1e9) < args.seconds:
            stepped = 0
            if plan and elapsed >= plan[0][0]:
                _, by = plan.pop(0)
                wall = time.clock_gettime_ns(time.CLOCK_REALTIME)
                time.clock_settime_ns(time.CLOCK_REALTIME, wall + by)
                stepped = by
            fresh = _samples(nv, handle, last_seen)
            ring = _samples(nv, handle, 0)
            mono = time.monotonic_ns()
            real = time.clock_gettime_ns(time.CLOCK_REALTIME)

            def behind(ts_us: int | None, now_ns: int = real, offset_ns: int = 0) -> float | None:
                """How long before now_ns a stamp lies, in ms (mapped through offset_ns)."""
                return (
                    None if ts_us is None else round((now_ns - ts_us * 1000 + offset_ns) / 1e6, 3)
                )

            newest = fresh[-1] if fresh else None
            rows.append(
                {
                    "t_s": round(elapsed, 3),
                    "stepped_ns": stepped,
                    "offset_change_ms": round((real - mono - offset0) / 1e6, 3),
                    "fresh": len(fresh),
                    # the newest stamp behind the read: by the wall clock now, and by the
                    # monotonic clock through the offset from before any step
                    "lag_wall_ms": behind(newest),
                    "lag_mono0_ms": behind(newest, mono, offset0),
                    "ring": len(ring),
                    "ring_oldest_lag_wall_ms": behind(ring[0] if ring else None),
                    "ring_newest_lag_wall_ms": behind(ring[-1] if ring else None),
                }
            )
            if fresh:
                last_seen = fresh[-1]
            time.sleep(READ_EVERY_S)
    finally:
        time.clock_settime_ns(time.CLOCK_REALTIME, time.monotonic_ns() + offset0)
        nv.nvmlShutdown()
    json.dump({"step_s": args.step, "rows": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
