"""Durations as people write them ("200us", "1.5ms", "2s") and as the engine keeps them (ns)."""

from __future__ import annotations

import math
import re

from gpujitter.errors import GpujitterError
from gpujitter.text import quoted

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zµ]*)\s*$")


def parse_duration_ns(text: str, default_unit: str = "ns") -> int:
    """'1.5ms' -> 1_500_000. A bare number is in default_unit."""
    m = _DURATION.match(str(text))
    unit = (m.group(2) or default_unit) if m else ""
    if not m or unit not in _UNITS_NS:
        raise GpujitterError(
            f"bad duration {quoted(text)}: "
            "want a number with a unit (ns, us, ms, s, m, h), e.g. 200us"
        )
    return _whole(float(m.group(1)) * _UNITS_NS[unit], f"bad duration {quoted(text)}")


def with_unit(text: str, unit: str) -> str:
    """`text` as a duration in `unit` where it is a bare number ("5" -> "5ms"), else as
    given: for a flag whose value reaches a parser where a bare number means another unit."""
    m = _DURATION.match(text)
    return f"{text.strip()}{unit}" if m and not m.group(2) else text


def _whole(value: float, what: str) -> int:
    """`value` rounded, never to 0 from above it; a number past a float's range is infinite
    here, which no int holds (round() would raise OverflowError, no one-line input error)."""
    if math.isinf(value):
        raise GpujitterError(f"{what}: too large")
    if round(value) == 0 < value:  # "0.4" bytes is no size; 0 often means "no limit"
        raise GpujitterError(f"{what}: rounds to 0")
    return round(value)


def format_ns(ns: int | float) -> str:
    """A duration for people: 850ns, 12.3us, 4.56ms, 1.20s."""
    ns = float(ns)
    if abs(ns) < 1_000:
        return f"{ns:.0f}ns"
    if abs(ns) < 1_000_000:
        return f"{ns / 1e3:.1f}us"
    if abs(ns) < 1_000_000_000:
        return f"{ns / 1e6:.2f}ms"
    return f"{ns / 1e9:.2f}s"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size_bytes(text: str | int) -> int:
    """'100M' -> 104_857_600. K, M, G, T are powers of 1024 (with or without 'B'/'iB'), as in
    logrotate and most tools operators know; a bare number or an int is bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise GpujitterError(f"bad size {quoted(text)}: want a number with K, M, G or T, e.g. 100M")
    return _whole(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()], f"bad size {quoted(text)}")


def format_bytes(n: int | float) -> str:
    """A size for people: 512B, 12.3KiB, 4.56MiB, 1.20GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.{1 if unit == 'KiB' else 2}f}{unit}"
    return f"{n:.0f}B"
