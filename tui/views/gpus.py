"""The GPUs view: per GPU its identity and NUMA node, the processes feeding it, its
utilisation and power over the last window with the idle gaps marked in their top cause's
colour, and where its idle time went (a bar of causes); a legend line over all of them.
When the boxed panels would not fit, each GPU takes five plain rows (eight GPUs fit 48 rows).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Static

from gpujitter.daemon.analysis.engine.causes import cause_label
from gpujitter.tui.decode import PENDING
from gpujitter.tui.model import NodeModel
from gpujitter.tui.text import gpu_title, join, ms, percent
from gpujitter.tui.views.timeline import bars, cause_bar, columns, gap_marks, legend

LABEL = 6  # "util  "
VALUE = 7  # " 100% " / " 412W"


def _total(ns: int) -> str:
    """A window's idle total in the value column: ms up to 10 s, then s, then h (printed as
    ms, 100 s took 8 columns, and the row wrapped out of its panel)."""
    if ns < 10_000_000_000:
        return f"{ms(ns)}ms"
    seconds = ns / 1e9
    if seconds < 1000:
        return f"{seconds:.1f}s"
    if seconds < 100_000:
        return f"{seconds:.0f}s"
    return f"{min(seconds / 3600, 99_999):.0f}h"


IDLE_BAR = 24  # cells of the idle-by-cause bar; its causes are named after it
WINDOWS_S = (10, 30, 60, 120, 300, 600)
FULL_LINES = 7  # header, feeders, util, power, gaps, idle, time axis
FULL_ROWS = FULL_LINES + 2  # inside a rounded box
COMPACT_LINES = 5  # header with feeders, util, power, gaps, idle; the window is in the legend
DRILL = "sudo gpujitter drill contention"


def no_gpu_note(example: str | None, live: bool) -> Text:
    """What the view says before any GPU is seen; live, it offers a first look: the example
    recording (`example`: the command that replays it, when there is one), and a drill to
    run beside this view, whose stalls show up as gaps."""
    out = Text("No GPU seen yet.", style="bold")
    out.append(
        " Without a GPU (or before the daemon reports one) this view stays empty; the CPUs "
        "view shows the host's interrupt and idle figures.\n",
        style="",
    )
    if not live:
        return out
    out.append("\nTo see a gap explained:\n", style="bold")
    if example is not None:
        out.append("\n  e", style="bold")
        out.append("  replay the example recording here, from a real GPU node:\n")
        out.append(f"       {example}\n", style="green")
        out.append("     n jumps to its next gap, 2 lists the gaps, enter explains one.\n")
    out.append("\n  or", style="bold")
    out.append("  make one: in another terminal run\n")
    out.append(f"       {DRILL}\n", style="green")
    out.append(
        "     It keeps a GPU (or, without one, a stand-in) fed and starves its feeding thread "
        "a few times; each stall shows up here as a gap, and the Gaps view (2) names "
        "run-queue wait as its cause.\n"
    )
    return out


class GpuPanel(Widget):
    """One GPU. Draws straight from the model on each refresh."""

    def __init__(self, model: NodeModel, gpu: int, view: GpusView) -> None:
        super().__init__(id=f"gpu-{gpu}", classes="gpu-panel")
        self.model = model
        self.gpu = gpu
        self.view = view

    def header(self) -> Text:
        m, info = self.model, self.model.gpus.get(self.gpu)
        node = m.gpu_node(self.gpu)
        parts: list[tuple[object, str] | str] = [(gpu_title(self.gpu), "bold")]
        if info is not None and info.name:
            parts.append((info.name, ""))
        parts.append((f"node {node}" if node >= 0 else "node ?", "cyan"))
        if info is not None and info.pci_bus_id:
            parts.append((info.pci_bus_id, "dim"))
        return join(*parts, sep="  ")

    def feeders(self) -> Text:
        pids = self.model.procs.get(self.gpu, ())
        if not pids:
            return Text("feeding: no process seen", style="dim", no_wrap=True)
        out = Text("feeding: ", no_wrap=True, overflow="ellipsis")
        for n, pid in enumerate(pids):
            if n:
                out.append(", ")
            name = self.model.name_of(pid)
            out.append(name or "?", style="bold")  # append() never parses markup
            out.append(f" ({pid})", style="dim")
        return out

    def idle_row(self, t0: int, t1: int, bar_w: int) -> Text:
        """Where the window's idle time went: a bar shared among the causes, then the causes
        by name and share, and the idle total."""
        spent = self.model.idle_by_cause(self.gpu, t0)
        total = sum(ns for _, ns in spent)
        row = Text(f"{'idle':<{LABEL}}", style="dim", no_wrap=True)
        if not total:
            row.append(f"{'none in this window':<{bar_w}}", style="dim")
            row.append(f"{'-':>{VALUE}}", style="dim")
            return row
        width = min(IDLE_BAR, bar_w // 3)
        row.append_text(cause_bar(spent, width))
        words = Text(no_wrap=True, overflow="ellipsis")
        for cause, ns in spent:
            if ns * 100 < total:
                break  # below 1 %: in the bar, not worth a name
            label = PENDING[0] if cause is None else cause_label(cause)
            words.append(f" {label} {percent(ns, total)}")
        words.truncate(bar_w - width, overflow="ellipsis", pad=True)
        row.append_text(words)
        row.append(f"{_total(total):>{VALUE}}", style="bold")
        return row

    def render(self) -> Text:
        m = self.model
        compact = self.view.compact
        width = max(self.content_size.width, 20)
        bar_w = width - LABEL - VALUE
        t1 = m.now_ns
        t0 = t1 - self.view.window_s * 1_000_000_000
        if compact:  # one line, ruled to the edge: the GPUs stay apart without boxes
            head = join(self.header(), "  ", self.feeders(), " ")
            head.append("─" * max(width - head.cell_len, 0), style="dim")
            lines = [head]
        else:
            lines = [self.header(), self.feeders()]
        util = m.series(self.gpu, "util")
        power = m.series(self.gpu, "power")
        top_power = max((v for _, v, _ in power), default=0.0)
        for label, series, top, unit, style in (
            ("util", util, 100.0, "%", "green"),
            ("power", power, top_power, "W", "magenta"),
        ):
            row = Text(f"{label:<{LABEL}}", style="dim", no_wrap=True)
            row.append_text(bars(columns(series, t0, t1, bar_w), top, style))
            latest = f"{series[-1][1]:.0f}{unit}" if series else "-"
            row.append(f"{latest:>{VALUE}}")
            lines.append(row)
        gaps = [(g.ts_ns, g.end_ns, m.top_cause(g)) for g in m.gaps_of(self.gpu, t0)]
        marks, n = gap_marks(gaps, t0, t1, bar_w)
        row = Text(f"{'gaps':<{LABEL}}", style="dim", no_wrap=True)
        row.append_text(marks)
        row.append(f"{n:>{VALUE}}", style="bold red" if n else "dim")
        lines.append(row)
        lines.append(self.idle_row(t0, t1, bar_w))
        if not compact:
            left, right = m.clock.time(t0, 0), m.clock.time(t1, 0)
            axis = " " * LABEL + left + right.rjust(max(bar_w - len(left), len(right) + 1))
            lines.append(Text(axis, style="dim", no_wrap=True))
        out = Text("\n").join(lines)
        out.no_wrap, out.overflow = True, "crop"  # a stale width must never wrap a row
        return out

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return COMPACT_LINES if self.view.compact else FULL_LINES


class GpusView(VerticalScroll):
    """Every GPU seen, as a panel under one legend line; a note when there is none."""

    def __init__(self, model: NodeModel, note: Text) -> None:
        super().__init__(id="gpus-view")
        self.model = model
        self.note = note
        self.window_s = 60
        self.filter = ""
        self.compact = False
        # The panels by GPU, in the order mounted: a CSS query over the view on each batch
        # took longer than drawing with ~1,000 GPUs.
        self._panels: dict[int, GpuPanel] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="gpus-legend")
        yield Static(self.note, id="no-gpu")

    def update_from_model(self) -> None:
        new = [GpuPanel(self.model, gpu, self) for gpu in self.model.gpu_indexes()
               if gpu not in self._panels]  # fmt: skip
        if new:
            self._panels.update((p.gpu, p) for p in new)
            self.mount_all(new)
        panels = list(self._panels.values())
        self.query_one("#no-gpu").display = not panels
        self.query_one("#gpus-legend").display = bool(panels)
        needle = self.filter.lower()
        for panel in panels:
            text = f"{panel.header().plain} {panel.feeders().plain}" if needle else ""
            panel.display = needle in text.lower()
        was = self.compact
        self._fit()
        self.query_one("#gpus-legend", Static).update(self.legend())
        # A panel's height changes only with the compact mode; a mount or a change of
        # display lays the view out by itself.
        for panel in panels:
            panel.refresh(layout=self.compact != was)

    def legend(self) -> Text:
        m = self.model
        t1 = m.now_ns
        t0 = t1 - self.window_s * 1_000_000_000
        causes = [m.top_cause(g) for gpu in m.gpu_indexes() for g in m.gaps_of(gpu, t0)]
        out = Text("gaps by top cause: " if causes else "no gap in this window", no_wrap=True)
        out.append_text(legend(causes))
        span = f"{m.clock.time(t0, 0)} → {m.clock.time(t1, 0)} ({self.window_s} s, +/- zoom)"
        out.append(f"   {span}", style="dim")  # the first thing cut on a narrow terminal
        out.overflow = "ellipsis"
        return out

    def _fit(self) -> None:
        """Boxed panels when they all fit the view's height, else the compact rows."""
        shown = sum(1 for p in self._panels.values() if p.display)
        room = self.size.height - 1  # under the legend
        self.compact = room > 0 and shown * FULL_ROWS > room
        self.set_class(self.compact, "-compact")

    def on_resize(self) -> None:
        was = self.compact
        self._fit()
        if was != self.compact:
            for panel in self._panels.values():
                panel.refresh(layout=True)

    def zoom(self, step: int) -> None:
        n = WINDOWS_S.index(self.window_s) if self.window_s in WINDOWS_S else 2
        self.window_s = WINDOWS_S[min(max(n + step, 0), len(WINDOWS_S) - 1)]
        self.update_from_model()
