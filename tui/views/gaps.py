"""The Gaps view: every gap (time, GPU, duration, resolution, top cause and its share, the
critical thread), newest first, longest first or by top cause (`s` cycles); its title line
says how many are shown, the order and the filter. Enter opens a gap's breakdown.

The model keeps up to GAP_LIMIT gaps and the view is redrawn on every batch of records, so it
keeps its rows rather than rebuilding them: a batch adds, redraws or removes only the rows of
gaps whose records changed (a rebuild of 2,000 rows took the app's only thread 0.2-0.4 s
a batch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from gpujitter.daemon.analysis.engine.causes import cause_colour, cause_label, cause_rank
from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.tui.model import NodeModel
from gpujitter.tui.text import WallClock, duration, gpu_number, join, percent, plain

COLUMNS = ("TIME", "GPU", "DURATION", "RES", "TOP CAUSE", "SHARE", "THREAD")
Row = tuple[GpuGap, Attribution | None]
# Rows leaving in one batch past which starting over is cheaper: remove_row renumbers every
# row after the one it removes (about 1 ms at 2,000 rows, where a rebuild takes 0.1-0.2 s).
REBUILD_AT = 100


def _cause_rank(row: Row) -> int:
    """The cause table's order; gaps still being attributed after every cause."""
    a = row[1]
    return cause_rank(a.top.cause) if a is not None and a.top is not None else cause_rank("") + 1


# name -> (the column it orders, how it reads, the key; rows sort ascending on it)
SORTS: dict[str, tuple[str, str, Callable[[Row], tuple[int, ...]]]] = {
    "time": ("TIME", "time, newest first", lambda r: (-r[0].ts_ns, r[0].gpu)),
    "duration": ("DURATION", "duration, longest first", lambda r: (-r[0].dur_ns, -r[0].ts_ns)),
    "cause": (
        "TOP CAUSE",
        "top cause, then longest",
        lambda r: (_cause_rank(r), -r[0].dur_ns, -r[0].ts_ns),
    ),
}


@dataclass(slots=True)
class Drawn:
    """What the rows were built from: what every row depends on (the clock, the filter, the
    order) and each gap's records as last drawn, rows the filter hides included."""

    clock: WallClock | None = None
    filter: str = ""
    order: str = ""
    rows: dict[str, Row] = field(default_factory=dict)


class GapsTable(DataTable[Text]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "cycle_sort", "Sort", tooltip="gaps: order by time, duration or top cause"),
    ]

    class Open(Message):
        def __init__(self, gap_id: str) -> None:
            super().__init__()
            self.gap_id = gap_id

    def __init__(self, model: NodeModel) -> None:
        super().__init__(id="gaps-table", cursor_type="row", zebra_stripes=True)
        self.model = model
        self.filter = ""
        self.order = "time"
        self._drawn = Drawn()

    def on_mount(self) -> None:
        self._add_columns()
        self._draw_title(0, 0)

    def _add_columns(self) -> None:
        """The columns, the sorted one marked ▼."""
        for name in COLUMNS:
            label = f"{name} ▼" if name == SORTS[self.order][0] else name
            self.add_column(label, key=name)

    def sort_by(self, order: str) -> None:
        self.order = order
        self._start_over(columns=True)
        self._add_columns()
        self.update_from_model()

    def action_cycle_sort(self) -> None:
        names = list(SORTS)
        self.sort_by(names[(names.index(self.order) + 1) % len(names)])

    def _draw_title(self, shown: int, total: int) -> None:
        count = f"{total} gaps" if shown == total else f"{shown} of {total} gaps"
        parts: list[tuple[object, str] | str] = [(count, "bold")]
        parts.append((f"sorted by {SORTS[self.order][1]} (s)", ""))
        if self.filter:
            parts.append((f'filter "{self.filter}" (/, esc clears)', "bold yellow"))
        else:
            parts.append(("no filter (/)", "dim"))
        self.border_title = join(*parts, sep=" · ")

    def row_cells(self, gap: GpuGap, a: Attribution | None) -> list[Text]:
        m = self.model
        res = Text(f"±{duration(gap.resolution_ns)}", style="dim")
        cells = [
            plain(m.clock.time(gap.ts_ns)),
            plain(gpu_number(gap.gpu)),
            Text(duration(gap.dur_ns), style="bold", justify="right"),
            res,
        ]
        if a is None or a.top is None:
            cells += [Text("attributing…", style="dim italic"), Text(""), Text("")]
            return cells
        top = a.top
        cells.append(Text(cause_label(top.cause), style=f"bold {cause_colour(top.cause)}"))
        cells.append(Text(percent(top.ns, gap.dur_ns), justify="right"))
        thread = Text(a.comm or "", no_wrap=True, overflow="ellipsis")  # untrusted: literal
        if a.tid:
            thread.append(f" {a.tid}", style="dim")
        cells.append(thread)
        return cells

    def matches(self, cells: list[Text]) -> bool:
        if not self.filter:
            return True
        text = " ".join(c.plain for c in cells).lower()
        return self.filter.lower() in text

    def update_from_model(self) -> None:
        selected = self.selected_gap()
        if not self._update_rows():
            self._start_over()
            self._update_rows()
        self._draw_title(self.row_count, len(self.model.gaps))
        if selected is None or not self.select_gap(selected):
            self.move_cursor(row=0)  # the selected gap went: the top, as on a rebuild

    def _start_over(self, columns: bool = False) -> None:
        """No rows: the next update draws every gap."""
        self.clear(columns=columns)
        self._drawn = Drawn(self.model.clock, self.filter, self.order)

    def _update_rows(self) -> bool:
        """Bring the rows up to the model, building only those of gaps whose records changed
        since drawn. False, having changed nothing, where every row must be redrawn (the
        clock, the filter or the order changed) or so many would go that starting over is
        cheaper (a view paused through a burst of gaps, say)."""
        m, drawn = self.model, self._drawn
        if (drawn.clock, drawn.filter, drawn.order) != (m.clock, self.filter, self.order):
            return False
        now = {gap_id: (gap, m.attributions.get(gap_id)) for gap_id, gap in m.gaps.items()}
        changed = [k for k, row in now.items() if drawn.rows.get(k) != row]
        # The cells of rows the filter hides are let go at once: holding 2,000 rows of them
        # made the collector triple what a keystroke in the filter costs.
        shown = {k: cells for k in changed if self.matches(cells := self.row_cells(*now[k]))}
        stale = (drawn.rows.keys() - now.keys()) | (set(changed) - shown.keys())
        going = [k for k in stale if k in self.rows]
        if len(going) > REBUILD_AT:
            return False
        for k in going:
            self.remove_row(k)
        for k, cells in shown.items():
            if k in self.rows:
                self._redraw_row(k, cells)
            else:
                self.add_row(*cells, key=k)
        drawn.rows = now
        if shown:
            self._sort_rows()
        return True

    def _redraw_row(self, gap_id: str, cells: list[Text]) -> None:
        for column, cell in zip(self.ordered_columns, cells, strict=True):
            # A wider cell widens its column, a narrower one leaves it: as on a rebuild (the
            # widths stay), and narrowing would have Textual measure the whole column.
            wider = cell.cell_len > column.content_width
            self.update_cell(gap_id, column.key, cell, update_width=wider)

    def _sort_rows(self) -> None:
        """The rows in the order a rebuild adds them (add_row adds at the bottom)."""
        order = sorted(self.model.gaps_newest_first(), key=SORTS[self.order][2])
        # DataTable.sort hands its key only the cells: a row's TIME cell, this very object,
        # stands for its gap.
        shown = [g.gap_id for g, _ in order if g.gap_id in self.rows]
        rank = {id(self.get_cell(gap_id, "TIME")): n for n, gap_id in enumerate(shown)}
        self.sort("TIME", key=lambda cell: rank[id(cell)])

    def selected_gap(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return key.value

    def select_gap(self, gap_id: str) -> bool:
        if gap_id not in self.rows:
            return False
        self.move_cursor(row=self.get_row_index(gap_id))
        return True

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Open(event.row_key.value))
