"""Durations as people write them ("200us", "1.5ms", "2s") and as the engine keeps them (ns)."""

from __future__ import annotations

import re

from gpujitter.errors import GpujitterError

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
            f"bad duration {text!r}: want a number with a unit (ns, us, ms, s, m, h), e.g. 200us"
        )
    return round(float(m.group(1)) * _UNITS_NS[unit])


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


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def parse_size_bytes(text: str | int) -> int:
    """'100MiB' -> 104857600, '1.5G' -> 1500000000, 4096 -> 4096."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise GpujitterError(f"bad size {text!r}: want a number with a unit, e.g. 100MiB or 1G")
    unit = (m.group(2) or "").lower().removesuffix("b")
    return round(float(m.group(1)) * _SIZE_UNITS[unit])
