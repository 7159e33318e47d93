"""A GPU's timeline in text: one character column per slice of the window, as a block whose
height is the value (utilisation, power), and a row marking where idle gaps fell."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.text import Text

BLOCKS = "▁▂▃▄▅▆▇█"
GAP_MARK = "━"


def columns(
    samples: Iterable[tuple[int, float, int]], t0: int, t1: int, width: int
) -> list[float | None]:
    """The mean value in each of `width` columns over [t0, t1); a sample (ts, value, period)
    covers [ts - period, ts]. None where no sample falls."""
    if width <= 0 or t1 <= t0:
        return []
    sums = [0.0] * width
    counts = [0] * width
    for ts, value, period in samples:
        start, end = ts - max(period, 0), ts
        if end < t0 or start >= t1:
            continue
        first, last = _span(start, end, t0, t1, width)
        for c in range(first, last + 1):
            sums[c] += value
            counts[c] += 1
    return [s / n if n else None for s, n in zip(sums, counts, strict=True)]


def _span(start: int, end: int, t0: int, t1: int, width: int) -> tuple[int, int]:
    """The first and last column [start, end) touches (a point: the column it falls in)."""
    span = t1 - t0
    first = max(0, (max(start, t0) - t0) * width // span)
    last_ns = min(end, t1) - 1 if end > start else min(end, t1 - 1)
    return first, min(width - 1, max(first, (last_ns - t0) * width // span))


def bars(values: Sequence[float | None], top: float, style: str) -> Text:
    out = Text(no_wrap=True)
    for v in values:
        if v is None:
            out.append(" ")
            continue
        level = 0 if top <= 0 else min(len(BLOCKS) - 1, int(v / top * (len(BLOCKS) - 1) + 0.5))
        out.append(BLOCKS[level], style=style if v > 0 else "dim " + style)
    return out


def gap_marks(
    gaps: Iterable[tuple[int, int, bool]], t0: int, t1: int, width: int
) -> tuple[Text, int]:
    """The gap row: a mark under every column a gap overlaps (attributed gaps in red, those
    still waiting for their attribution in yellow), and how many gaps the window holds."""
    cells: list[str | None] = [None] * width
    n = 0
    for start, end, attributed in gaps:
        if end < t0 or start >= t1 or width <= 0 or t1 <= t0:
            continue
        n += 1
        first, last = _span(start, end, t0, t1, width)
        for c in range(first, last + 1):
            if cells[c] != "red":
                cells[c] = "red" if attributed else "yellow"
    out = Text(no_wrap=True)
    for style in cells:
        out.append(GAP_MARK if style else "·", style=f"bold {style}" if style else "dim")
    return out, n
