"""A GPU's timeline in text: one character column per slice of the window, as a block whose
height is the value (utilisation, power), a row marking where idle gaps fell in their top
cause's colour, and bars sharing idle time among causes, with the legend of the colours."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rich.text import Text

from gpujitter.daemon.analysis.engine.causes import cause_colour, cause_label, cause_rank
from gpujitter.tui.decode import PENDING

BLOCKS = "▁▂▃▄▅▆▇█"
GAP_MARK = "━"
PENDING_MARK = "╍"
BAR = "█"


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
        # Clamped both ways: a value above the top, or below zero (a counter's glitch), is
        # drawn at the edge rather than indexing BLOCKS from its end; so is one past any
        # float (a recording's 1e308 twice in a column sums to inf: int() of it raised).
        ratio = v / top if top > 0 else 0.0
        if math.isfinite(ratio):
            level = max(0, min(len(BLOCKS) - 1, int(ratio * (len(BLOCKS) - 1) + 0.5)))
        else:
            level = len(BLOCKS) - 1 if ratio > 0 else 0
        out.append(BLOCKS[level], style=style if v > 0 else "dim " + style)
    return out


def gap_marks(
    gaps: Iterable[tuple[int, int, str | None]], t0: int, t1: int, width: int
) -> tuple[Text, int]:
    """The gap row: a mark under every column a gap (start, end, top cause or None while
    the engine still works on it) overlaps, in its top cause's colour; an attributed gap
    wins a column over a pending one, a longer one over a shorter. Also how many gaps the
    window holds."""
    cells: list[tuple[bool, int, str | None] | None] = [None] * width
    n = 0
    for start, end, cause in gaps:
        if end < t0 or start >= t1 or width <= 0 or t1 <= t0:
            continue
        n += 1
        first, last = _span(start, end, t0, t1, width)
        mark = (cause is not None, end - start, cause)
        for c in range(first, last + 1):
            held = cells[c]
            if held is None or held[:2] < mark[:2]:
                cells[c] = mark
    out = Text(no_wrap=True)
    for cell in cells:
        if cell is None:
            out.append("·", style="dim")
        elif cell[2] is None:
            out.append(PENDING_MARK, style=f"bold {PENDING[1]}")
        else:
            out.append(GAP_MARK, style=f"bold {cause_colour(cell[2])}")
    return out, n


def cause_bar(parts: Sequence[tuple[str | None, int]], width: int) -> Text:
    """One row of `width` cells shared among causes (None: not attributed yet) by their ns,
    largest remainder first, so the row is always full and a cause above zero gets a cell
    when it can."""
    total = sum(ns for _, ns in parts) or 1
    exact = [ns * width / total for _, ns in parts]
    cells = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in order[: width - sum(cells)]:
        cells[i] += 1
    out = Text(no_wrap=True)
    for (cause, _), n in zip(parts, cells, strict=True):
        out.append(BAR * n, style=PENDING[1] if cause is None else cause_colour(cause))
    return out


def legend(causes: Iterable[str | None]) -> Text:
    """What the marks' colours mean, for the causes given (None: pending), in the cause
    table's order."""
    seen = set(causes)
    out = Text(no_wrap=True, overflow="ellipsis")
    for cause in sorted((c for c in seen if c is not None), key=cause_rank):
        out.append(GAP_MARK, style=f"bold {cause_colour(cause)}")
        out.append(f" {cause_label(cause)}  ")
    if None in seen:
        out.append(PENDING_MARK, style=f"bold {PENDING[1]}")
        out.append(f" {PENDING[0]}  ")
    out.rstrip()
    return out
