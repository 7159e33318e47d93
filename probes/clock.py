"""The engine's clock is CLOCK_MONOTONIC ns; wall time appears only at the edges, through a
ClockRef (a monotonic and a realtime reading taken back to back)."""

from __future__ import annotations

import time
from datetime import datetime

from gpujitter.probes.events import ClockRef


def clock_ref() -> ClockRef:
    """Take the pair of readings whose gap is smallest out of a few tries (the two reads can
    be split by preemption; the tightest pair bounds the error)."""
    best: tuple[int, int, int] | None = None
    for _ in range(5):
        a = time.monotonic_ns()
        wall = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) // 2, wall)
    assert best is not None
    return ClockRef(ts_ns=best[1], realtime_ns=best[2])


def wall_ns(ref: ClockRef, mono_ns: int) -> int:
    return ref.realtime_ns + (mono_ns - ref.ts_ns)


def format_wall(ref: ClockRef, mono_ns: int, *, date: bool = False) -> str:
    """Local wall time of a monotonic timestamp: 12:01:07.250123, or with the date and the
    zone's UTC offset if asked (2026-12-01 12:01:07.250123 +0000), which journalctl,
    Prometheus and Grafana times can be compared with."""
    dt = datetime.fromtimestamp(wall_ns(ref, mono_ns) / 1e9).astimezone()
    return dt.strftime("%Y-%m-%d %H:%M:%S.%f %z" if date else "%H:%M:%S.%f")
