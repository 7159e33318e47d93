"""Map NVML sample timestamps (microseconds, on a host clock NVML does not name) onto the
engine's CLOCK_MONOTONIC nanoseconds, by measurement (docs/gpu.md, "Clock calibration").

For each candidate host clock, the lag from a sample's timestamp to the moment it was read
must be small and never negative; the clock NVML stamps with is the one where that holds.
Measured on the H200 (driver 580): CLOCK_REALTIME. The mapping is then
mono_ns = ts_us * 1000 - (realtime_ns - mono_ns), with the offset re-read at every poll so
that a stepped or slewed wall clock moves the mapping with it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

CLOCKS = {
    "realtime": time.CLOCK_REALTIME,
    "boottime": time.CLOCK_BOOTTIME,
    "monotonic": time.CLOCK_MONOTONIC,
}
# A sample is never read before it is taken; allow for the two clocks read not quite at once.
EARLY_NS = 1_000_000
# Nor later than the deepest ring NVML keeps (utilisation: ~71 samples of 200 ms).
_LATE_NS = 20_000_000_000


def live_offsets() -> dict[str, int]:
    """candidate clock -> (its reading - CLOCK_MONOTONIC), from the tightest of a few pairs."""
    out: dict[str, int] = {}
    for name, clock in CLOCKS.items():
        best: tuple[int, int] | None = None
        for _ in range(3):
            a = time.monotonic_ns()
            value = time.clock_gettime_ns(clock)
            b = time.monotonic_ns()
            if best is None or b - a < best[0]:
                best = (b - a, value - (a + b) // 2)
        assert best is not None
        out[name] = best[1]
    return out


def offsets_from_header(header: Mapping[str, int]) -> dict[str, int]:
    """The offsets a recording's header was taken with (probes/nvml_session.py)."""
    mono = int(header["mono_ns"])
    return {
        "realtime": int(header["realtime_ns"]) - mono,
        "boottime": int(header["boottime_ns"]) - mono,
        "monotonic": 0,
    }


@dataclass(frozen=True, slots=True)
class Observation:
    """A sample timestamp (NVML µs) and when it was read (CLOCK_MONOTONIC ns), with the
    candidate clocks' offsets at that moment."""

    ts_us: int
    read_mono_ns: int
    offsets: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Calibration:
    source: str  # the host clock NVML stamps samples with
    lag_min_ns: int  # from a sample's timestamp to its read, over the observations
    lag_median_ns: int
    lag_max_ns: int
    observations: int


class CalibrationFailed(Exception):
    """No candidate clock explains the observed timestamps: one line why."""


def calibrate(observations: Iterable[Observation]) -> Calibration:
    """The candidate clock under which every observed sample was read after it was taken and
    within the ring's depth; the smallest median lag wins if several do."""
    obs = list(observations)
    if not obs:
        raise CalibrationFailed("no NVML samples to calibrate with")
    fits: list[tuple[int, str, list[int]]] = []
    for name in CLOCKS:
        lags = [o.read_mono_ns - (o.ts_us * 1000 - o.offsets[name]) for o in obs]
        if min(lags) >= -EARLY_NS and max(lags) <= _LATE_NS:
            fits.append((int(statistics.median(lags)), name, lags))
    if not fits:
        spread = {
            name: min(o.read_mono_ns - (o.ts_us * 1000 - o.offsets[name]) for o in obs)
            for name in CLOCKS
        }
        raise CalibrationFailed(f"NVML timestamps match no host clock (min lag ns: {spread})")
    median, name, lags = min(fits)
    return Calibration(
        source=name,
        lag_min_ns=max(0, min(lags)),
        lag_median_ns=median,
        lag_max_ns=max(lags),
        observations=len(lags),
    )


def observe(
    read: Callable[[int], list[int] | None],
    offsets: Callable[[], Mapping[str, int]] = live_offsets,
    clock: Callable[[], int] = time.monotonic_ns,
    polls: int = 40,
    interval_s: float = 0.01,
) -> list[Observation]:
    """Poll a sample stream (`read(last_seen_us)` -> new timestamps) `polls` times and note
    when each new sample was first seen."""
    out: list[Observation] = []
    last_seen = 0
    for i in range(polls):
        stamps = read(last_seen)
        now = clock()
        offs = offsets()
        if stamps:
            # The first read returns the whole ring: only its newest entry was just taken.
            fresh = stamps if i else stamps[-1:]
            out += [Observation(ts, now, offs) for ts in fresh]
            last_seen = max(stamps)
        time.sleep(interval_s)
    return out
