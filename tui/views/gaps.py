"""The Gaps view: every gap, newest first (time, GPU, duration, resolution, top cause and its
share, the critical thread); enter opens its breakdown."""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from gpujitter.tui.decode import Attribution, Gap, cause_colour, cause_label
from gpujitter.tui.model import NodeModel
from gpujitter.tui.text import duration, percent, plain

COLUMNS = ("TIME", "GPU", "DURATION", "RES", "TOP CAUSE", "SHARE", "THREAD")


class GapsTable(DataTable[Text]):
    class Open(Message):
        def __init__(self, gap_id: str) -> None:
            super().__init__()
            self.gap_id = gap_id

    def __init__(self, model: NodeModel) -> None:
        super().__init__(id="gaps-table", cursor_type="row", zebra_stripes=True)
        self.model = model
        self.filter = ""

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)

    def row_cells(self, gap: Gap, a: Attribution | None) -> list[Text]:
        m = self.model
        res = Text(f"±{duration(gap.resolution_ns)}", style="dim")
        cells = [
            plain(m.clock.time(gap.ts_ns)),
            plain(gap.gpu),
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
        for gap, a in self.model.gaps_newest_first():
            cells = self.row_cells(gap, a)
            if self.matches(cells):
                self.add_row(*cells, key=gap.gap_id)
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
