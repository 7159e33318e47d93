"""The Gaps view: every gap (time, GPU, duration, resolution, top cause and its share, the
critical thread), newest first, longest first or by top cause (`s` cycles); its title line
says how many are shown, the order and the filter. Enter opens a gap's breakdown."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from gpujitter.daemon.analysis.engine.causes import cause_colour, cause_label, cause_rank
from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.tui.model import NodeModel
from gpujitter.tui.text import duration, gpu_number, join, percent, plain

COLUMNS = ("TIME", "GPU", "DURATION", "RES", "TOP CAUSE", "SHARE", "THREAD")
Row = tuple[GpuGap, Attribution | None]


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
        self.clear(columns=True)
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
        self.clear()
        rows = sorted(self.model.gaps_newest_first(), key=SORTS[self.order][2])
        for gap, a in rows:
            cells = self.row_cells(gap, a)
            if self.matches(cells):
                self.add_row(*cells, key=gap.gap_id)
        self._draw_title(self.row_count, len(rows))
        if selected is not None and selected in self.rows:
            self.select_gap(selected)

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
