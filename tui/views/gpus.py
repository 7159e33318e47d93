"""The GPUs view: per GPU its identity and NUMA node, the processes feeding it, and its
utilisation and power over the last window with the idle gaps marked under them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Static

from gpujitter.tui.model import NodeModel
from gpujitter.tui.text import join
from gpujitter.tui.views.timeline import bars, columns, gap_marks

LABEL = 6  # "util  "
VALUE = 7  # " 100% " / " 412W"
WINDOWS_S = (10, 30, 60, 120, 300, 600)
PANEL_LINES = 6  # header, feeders, util, power, gaps, time axis


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
        parts: list[tuple[object, str] | str] = [(f"GPU {self.gpu}", "bold")]
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

    def render(self) -> Text:
        m = self.model
        width = max(self.content_size.width, 20)
        bar_w = width - LABEL - VALUE
        t1 = m.now_ns
        t0 = t1 - self.view.window_s * 1_000_000_000
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
        attributed = m.attributions
        gaps = [(g.ts_ns, g.end_ns, g.gap_id in attributed) for g in m.gaps_of(self.gpu, t0)]
        marks, n = gap_marks(gaps, t0, t1, bar_w)
        row = Text(f"{'gaps':<{LABEL}}", style="dim", no_wrap=True)
        row.append_text(marks)
        row.append(f"{n:>{VALUE}}", style="bold red" if n else "dim")
        lines.append(row)
        left, right = m.clock.time(t0, 0), m.clock.time(t1, 0)
        axis = " " * LABEL + left + right.rjust(max(bar_w - len(left), len(right) + 1))
        lines.append(Text(axis, style="dim", no_wrap=True))
        out = Text("\n").join(lines)
        out.no_wrap, out.overflow = True, "crop"  # a stale width must never wrap a row
        return out

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return PANEL_LINES


class GpusView(VerticalScroll):
    """Every GPU seen, as a panel; a note when there is none."""

    def __init__(self, model: NodeModel) -> None:
        super().__init__(id="gpus-view")
        self.model = model
        self.window_s = 60
        self.filter = ""

    def compose(self) -> ComposeResult:
        yield Static(
            "No GPU seen yet. Without a GPU (or before the daemon reports one) this view stays "
            "empty; the CPUs view shows the host's interrupt and idle figures.",
            id="no-gpu",
        )

    def update_from_model(self) -> None:
        have = {p.gpu for p in self.query(GpuPanel)}
        for gpu in self.model.gpu_indexes():
            if gpu not in have:
                self.mount(GpuPanel(self.model, gpu, self))
        panels = list(self.query(GpuPanel))
        self.query_one("#no-gpu").display = not panels
        needle = self.filter.lower()
        for panel in panels:
            text = panel.header().plain + " " + panel.feeders().plain
            panel.display = needle in text.lower()
            panel.refresh()

    def zoom(self, step: int) -> None:
        n = WINDOWS_S.index(self.window_s) if self.window_s in WINDOWS_S else 2
        self.window_s = WINDOWS_S[min(max(n + step, 0), len(WINDOWS_S) - 1)]
        self.update_from_model()
