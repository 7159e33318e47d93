"""`gpujitter report --html`: one self-contained HTML page of a recording's attributions, for
people who would rather look than read: per GPU, idle time by cause over time, the
distribution of gap durations, the top culprits (tasks that ran instead, IRQs) and the
fixes. Charts are inline SVG and styles inline CSS: nothing is fetched, the file works
offline and can be mailed. Every text from the recording is HTML-escaped."""

from __future__ import annotations

import html
import math
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from gpujitter.daemon.analysis.describe import gpu_name, one_line
from gpujitter.daemon.analysis.engine.causes import CAUSES, cause_colour, cause_label
from gpujitter.daemon.analysis.records import Attribution, IrqEvidence, TaskEvidence, task_name
from gpujitter.daemon.offline.longest import Longest
from gpujitter.probes.clock import Clocks, format_wall
from gpujitter.text import printable
from gpujitter.units import format_ns

BUCKETS = 48  # columns of the idle-by-cause chart
# Each page's first bytes: how `report --html` knows a file it may replace (a page of its
# own, the report run again) from one it must not (a recording, a document named by mistake).
TITLE = "GPU idle gaps on "  # and the host's name
_HEAD = f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{TITLE}"

DURATION_EDGES_MS = (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class _Ints:
    """Integers in the order appended: 8 bytes each (an array) while they fit in 64 bits,
    else (a recording from elsewhere may hold anything) Python's ints in a list."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: array[int] | list[int] = array("q")

    def append(self, value: int) -> None:
        try:
            self.items.append(value)
        except (OverflowError, TypeError):  # (the array is left as it was)
            self.items = [*self.items, value]


@dataclass(slots=True)
class GpuSummary:
    """What one GPU's section shows, taken in one attribution at a time: sums, counts, the
    `top` longest gaps' lines, and for the chart over time (whose columns are known only
    once the recording's end is) each gap's start, end and parts as a few ints."""

    longest: Longest[str]  # the lines of the longest gaps
    gaps: int = 0
    idle_ns: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    durations: list[int] = field(default_factory=lambda: [0] * len(DURATION_EDGES_MS))
    tasks: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    irqs: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    fixes: Counter[str] = field(default_factory=Counter)
    # per gap: ts_ns, end_ns, its number of parts, then per part its cause's number and ns
    spans: _Ints = field(default_factory=_Ints)


def _e(text: object) -> str:
    """Markup escaped, and control characters (a host name's ESC or BEL) written as escapes:
    a page is read in browsers and, as often, with cat and less."""
    return html.escape(printable(str(text)), quote=True)


def _legend(causes: Iterable[str]) -> str:
    items = "".join(
        f'<span class="key"><i style="background:{cause_colour(c)}"></i>{_e(cause_label(c))}</span>'
        for c in causes
    )
    return f'<div class="legend">{items}</div>'


def idle_over_time(
    gaps: Iterable[tuple[int, int, Sequence[tuple[str, int]]]], start_ns: int, end_ns: int
) -> str:
    """Stacked columns: per time bucket, the idle time each cause took (its gaps' parts,
    spread over the bucket(s) each gap falls in, in proportion). gaps: (ts_ns, end_ns,
    [(cause, ns) of each part]) in the order they came (each column's sums are added in
    that order, to the bit)."""
    span = max(end_ns - start_ns, 1)
    width = span / BUCKETS
    cols: list[defaultdict[str, float]] = [defaultdict(float) for _ in range(BUCKETS)]
    for ts_ns, gap_end_ns, parts in gaps:
        dur_ns = gap_end_ns - ts_ns
        for k in range(BUCKETS):
            lo, hi = start_ns + k * width, start_ns + (k + 1) * width
            overlap = min(hi, gap_end_ns) - max(lo, ts_ns)
            if overlap > 0:
                for cause, ns in parts:
                    cols[k][cause] += ns * overlap / dur_ns
    peak = max((sum(c.values()) for c in cols), default=0) or 1
    w, h, pad = 720, 180, 30
    bar = (w - pad) / BUCKETS
    rects = []
    for k, col in enumerate(cols):
        y = float(h - pad)
        for cause in CAUSES:
            if col[cause] <= 0:
                continue
            height = (h - 2 * pad) * col[cause] / peak
            y -= height
            rects.append(
                f'<rect x="{pad + k * bar:.1f}" y="{y:.1f}" width="{bar * 0.9:.1f}" '
                f'height="{height:.1f}" fill="{cause_colour(cause)}">'
                f"<title>{_e(cause_label(cause))}: {_e(format_ns(int(col[cause])))}</title></rect>"
            )
    axis = (
        f'<text x="{pad}" y="{h - 8}" class="axis">{_e(format_ns(0))}</text>'
        f'<text x="{w}" y="{h - 8}" class="axis" text-anchor="end">+{_e(format_ns(span))}</text>'
        f'<text x="0" y="{pad - 8}" class="axis">{_e(format_ns(int(peak)))} idle per '
        f"{_e(format_ns(int(width)))}</text>"
    )
    return f'<svg viewBox="0 0 {w} {h}" class="chart" role="img">{"".join(rects)}{axis}</svg>'


def _duration_bin(dur_ns: int) -> int:
    """The column of duration_histogram a gap of dur_ns falls in."""
    edges = [*DURATION_EDGES_MS, math.inf]
    ms = dur_ns / 1e6
    for i in range(len(edges) - 1):
        if edges[i] <= ms < edges[i + 1] or (i == 0 and ms < edges[0]):
            return i
    return -1  # none (NaN): not counted


def duration_histogram(counts: Sequence[int]) -> str:
    """How many gaps fell in each duration range (log-spaced, 5 ms to 5 s and above)."""
    edges = [*DURATION_EDGES_MS, math.inf]
    peak = max(counts, default=0) or 1
    w, h, pad = 720, 160, 30
    bar = (w - pad) / len(counts)
    parts = []
    for i, n in enumerate(counts):
        height = (h - 2 * pad) * n / peak
        label = f"{edges[i]:g}+" if edges[i + 1] == math.inf else f"{edges[i]:g}"
        x = pad + i * bar
        parts.append(
            f'<rect x="{x:.1f}" y="{h - pad - height:.1f}" width="{bar * 0.8:.1f}" '
            f'height="{height:.1f}" fill="#0072b2"><title>{n} gaps</title></rect>'
            f'<text x="{x + bar * 0.4:.1f}" y="{h - 12}" class="axis" text-anchor="middle">'
            f"{label} ms</text>"
            f'<text x="{x + bar * 0.4:.1f}" y="{h - pad - height - 4:.1f}" class="axis" '
            f'text-anchor="middle">{n}</text>'
        )
    return f'<svg viewBox="0 0 {w} {h}" class="chart" role="img">{"".join(parts)}</svg>'


def _add_culprits(a: Attribution, tasks: dict[str, list[int]], irqs: dict[str, list[int]]) -> None:
    """Adds to (name -> [ns, gaps]) the tasks that ran instead of a feeding thread during
    `a` and the IRQs that stole its time."""
    seen: set[str] = set()
    for p in a.parts:
        for ev in p.evidence:
            if isinstance(ev, TaskEvidence) and ev.tid:
                key, table = task_name(ev), tasks
            elif isinstance(ev, IrqEvidence):
                key, table = f"{ev.name} ({ev.irq_kind} {ev.irq})", irqs
            else:
                continue
            table[key][0] += ev.ns
            if key not in seen:
                table[key][1] += 1
                seen.add(key)


def culprits(
    tasks: dict[str, list[int]], irqs: dict[str, list[int]]
) -> tuple[list[tuple[str, int, int]], ...]:
    """(name, ns, gaps) of the tasks that ran instead of a feeding thread and of the IRQs
    that stole its time, most time first (then first seen)."""
    ranked = (
        sorted(((k, v[0], v[1]) for k, v in t.items()), key=lambda r: -r[1])[:10]
        for t in (tasks, irqs)
    )
    return tuple(ranked)


_CULPRITS = (
    ("task", "Tasks that ran instead of the feeding threads"),
    ("IRQ", "Interrupts that stole the feeding threads' time"),
)


def _shares(causes: Counter[str], total_ns: int) -> Iterable[tuple[str, str, str]]:
    for cause, ns in causes.most_common():
        # max: gaps of no length (a log's hand-made line) make a total of 0
        yield cause_label(cause), format_ns(ns), f"{100 * ns / max(total_ns, 1):.1f} %"


def _table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    cols = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f"<table><thead><tr>{cols}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:800px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
.chart{width:100%;height:auto;background:#fafafa}.axis{font-size:11px;fill:#555}
table{border-collapse:collapse;width:100%;margin:.5em 0}td,th{padding:2px 8px;text-align:left;
border-bottom:1px solid #eee}th{background:#f3f3f3}.legend{margin:.3em 0}
.key{display:inline-block;margin-right:1em}.key i{display:inline-block;width:.9em;height:.9em;
margin-right:.3em;vertical-align:-.1em}.fix{font-family:monospace;font-size:12px}
.meta{color:#555}code{font-size:12px}
"""


class Page:
    """The page: one section per GPU, of the attributions added one at a time. It holds
    none of them: per GPU its sums and counts, the `top` longest gaps as their lines, and
    per gap the few ints the chart over time needs (~60 bytes a gap; an attribution is
    ~3 KB and a day of a busy node has hundreds of thousands)."""

    def __init__(self, clocks: Clocks, top: int = 10) -> None:
        self.clocks = clocks
        # a gap's line by the clock of its time (a clock set during the run moves it), as
        # the recording's events have given them so far: those before the gap's
        self.per_gpu: dict[int, GpuSummary] = defaultdict(
            lambda: GpuSummary(Longest(top, lambda a: one_line(a, clocks.at(a.ts_ns))))
        )
        self._cause_ids: dict[str, int] = {}  # the chart's parts name their cause by number
        self._causes: list[str] = []

    def add(self, a: Attribution) -> None:
        s = self.per_gpu[a.gpu]
        s.gaps += 1
        s.idle_ns += a.dur_ns
        spans = s.spans
        spans.append(a.ts_ns)
        spans.append(a.end_ns)
        spans.append(len(a.parts))
        for p in a.parts:
            s.causes[p.cause] += p.ns
            cause = self._cause_ids.get(p.cause)
            if cause is None:
                cause = self._cause_ids[p.cause] = len(self._causes)
                self._causes.append(p.cause)
            spans.append(cause)
            spans.append(p.ns)
        if (column := _duration_bin(a.dur_ns)) >= 0:
            s.durations[column] += 1
        _add_culprits(a, s.tasks, s.irqs)
        for remedy in a.remedies:
            s.fixes[remedy] += 1
        s.longest.add(a)

    def _gaps(self, s: GpuSummary) -> Iterator[tuple[int, int, list[tuple[str, int]]]]:
        """(ts_ns, end_ns, [(cause, ns) of each part]) of each of a GPU's gaps, in order."""
        items, causes = s.spans.items, self._causes
        i = 0
        while i < len(items):
            ts_ns, end_ns, n = items[i], items[i + 1], items[i + 2]
            parts = [(causes[items[j]], items[j + 1]) for j in range(i + 3, i + 3 + 2 * n, 2)]
            yield ts_ns, end_ns, parts
            i += 3 + 2 * n

    def _wall(self, mono_ns: int) -> str:
        return format_wall(self.clocks.at(mono_ns), mono_ns, date=True)

    def render(self, *, title: str, meta: Sequence[str], start_ns: int, end_ns: int) -> str:
        out = [
            "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            *(f'<p class="meta">{_e(line)}</p>' for line in meta),
        ]
        if not self.per_gpu:
            out.append("<p>No GPU idle gaps were attributed in this range.</p>")
        for gpu, s in sorted(self.per_gpu.items()):
            causes = s.causes
            span = max(end_ns - start_ns, 1)
            out += [
                f"<h2>{_e(gpu_name(gpu))}: {s.gaps} gaps, {_e(format_ns(s.idle_ns))} "
                f"idle ({100 * s.idle_ns / span:.1f} % of the recording)</h2>",
                "<h3>Idle time by cause over time</h3>",
                _legend(c for c in CAUSES if causes[c]),
                idle_over_time(self._gaps(s), start_ns, end_ns),
                "<h3>Where the idle time went</h3>",
                _table(["cause", "time", "share"], _shares(causes, s.idle_ns)),
                "<h3>Gap durations</h3>",
                duration_histogram(s.durations),
            ]
            for (name, heading), rows in zip(_CULPRITS, culprits(s.tasks, s.irqs), strict=True):
                if rows:
                    table = _table(
                        [name, "time", "gaps"], ((n, format_ns(ns), g) for n, ns, g in rows)
                    )
                    out += [f"<h3>{heading}</h3>", table]
            if s.fixes:
                out.append("<h3>Fixes, by how many gaps they address</h3>")
                out.append(
                    _table(["gaps", "fix"], ((n, fix) for fix, n in s.fixes.most_common(10)))
                )
            longest = s.longest.items()
            out.append(f"<h3>The {len(longest)} longest gaps</h3>")
            out += [f'<p class="fix">{_e(line)}</p>' for line in longest]
        out.append(
            f'<p class="meta">Recorded from {_e(self._wall(start_ns))} to '
            f"{_e(self._wall(end_ns))}; gap times are local to the recording "
            "node, with their UTC offset above.</p></body></html>\n"
        )
        return "".join(out)


def is_report_page(head: bytes) -> bool:
    """Whether a file's first bytes are those of a page `report --html` wrote."""
    return head.startswith(_HEAD.encode())
