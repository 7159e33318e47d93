"""The CPUs view: per CPU its NUMA node, the share of time interrupts took (hard and soft),
where it idled (residency per idle state), its busiest interrupts, and the watched threads
that last ran there; threads placed on a node other than their GPU's, and IRQs handled off
their device's node, in red."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from gpujitter.tui.model import CpuRow, NodeModel

COLUMNS = ("CPU", "NODE", "HARDIRQ", "SOFTIRQ", "IDLE", "INTERRUPTS", "WATCHED THREADS")
REMOTE = "bold red"


def load(fraction: float) -> Text:
    style = "red" if fraction >= 0.1 else "yellow" if fraction >= 0.02 else ""
    return Text(f"{100 * fraction:5.1f}%", style=style, justify="right")


def idle_text(row: CpuRow) -> Text:
    if not row.idle:
        return Text("-", style="dim")
    return Text("  ".join(f"{name} {100 * share:.0f}%" for name, share in row.idle[:3]))


def irq_text(row: CpuRow) -> Text:
    out = Text(no_wrap=True, overflow="ellipsis")
    remote = {name for name, _, _ in row.remote_irqs}
    for n, (name, ns, count) in enumerate(row.top_irqs[:3]):
        if n:
            out.append(", ")
        out.append(name, style=REMOTE if name in remote else "")  # literal: never markup
        out.append(f" {count}×" if not ns else f" {ns / 1e6:.1f}ms", style="dim")
    return out if row.top_irqs else Text("-", style="dim")


def threads_text(row: CpuRow) -> Text:
    out = Text(no_wrap=True, overflow="ellipsis")
    for n, (t, remote) in enumerate(row.threads):
        if n:
            out.append(", ")
        out.append(t.comm or "?", style=REMOTE if remote else "bold")
        out.append(f" {t.tid}", style=REMOTE if remote else "dim")
        if remote:
            out.append(" remote", style=REMOTE)
    return out


def row_cells(row: CpuRow) -> list[Text]:
    return [
        Text(str(row.cpu), justify="right"),
        Text(str(row.node) if row.node >= 0 else "?", justify="right"),
        load(row.hardirq),
        load(row.softirq),
        idle_text(row),
        irq_text(row),
        threads_text(row),
    ]


class CpusTable(DataTable[Text]):
    def __init__(self, model: NodeModel) -> None:
        super().__init__(id="cpus-table", cursor_type="row", zebra_stripes=True)
        self.model = model
        self.filter = ""
        # Each CPU's row as last drawn (or hidden by the filter), and the filter it was drawn
        # with: a batch redraws the CPUs whose rows changed, not all of them (8,192 CPUs
        # rebuilt per batch held a key for seconds).
        self._drawn: dict[int, CpuRow] = {}
        self._drawn_filter = ""

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)

    def update_from_model(self) -> None:
        cursor = self.cursor_row
        rows = {row.cpu: row for row in self.model.cpu_rows()}
        if self.filter != self._drawn_filter or self._drawn.keys() - rows.keys():
            self.clear()  # a new filter, or CPUs gone (a replay started over): every row anew
            self._drawn, self._drawn_filter = {}, self.filter
        added = False
        for cpu, row in rows.items():
            if self._drawn.get(cpu) == row:
                continue
            self._drawn[cpu] = row
            key = str(cpu)
            cells = row_cells(row)
            needle = self.filter.lower()
            if needle and needle not in " ".join(c.plain for c in cells).lower():
                if key in self.rows:
                    self.remove_row(key)
            elif key in self.rows:
                self._redraw_row(key, cells)
            else:
                self.add_row(*cells, key=key)
                added = True
        if added:  # add_row adds at the bottom: the CPUs in their order again
            self.sort("CPU", key=lambda cell: int(cell.plain))
        if self.row_count:
            self.move_cursor(row=min(cursor, self.row_count - 1))

    def _redraw_row(self, key: str, cells: list[Text]) -> None:
        for column, cell in zip(self.ordered_columns, cells, strict=True):
            # Wider cells widen their column; narrower ones leave it, as a rebuild would not
            # (narrowing has Textual measure the whole column).
            wider = cell.cell_len > column.content_width
            self.update_cell(key, column.key, cell, update_width=wider)
