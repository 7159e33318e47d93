"""The Audit view: `gpujitter audit`'s findings on the node's tuning, worst first; enter
shows a finding's evidence (the value read, the file) and its fix."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from gpujitter.daemon.checks.audit.model import Finding
from gpujitter.tui.audit import AuditReport
from gpujitter.tui.text import plain

COLUMNS = ("SEVERITY", "RULE", "SUBJECT", "FINDING")
SEVERITY_STYLE = {
    "critical": "bold white on red",
    "warn": "bold yellow",
    "info": "cyan",
    "ok": "green",
}
SEVERITY_MARK = {"critical": "CRIT", "warn": "WARN", "info": "INFO", "ok": "OK"}


def severity_text(severity: str) -> Text:
    return Text(SEVERITY_MARK.get(severity, severity), style=SEVERITY_STYLE.get(severity, ""))


def finding_text(f: Finding) -> Text:
    out = severity_text(f.severity)
    out.append("  ")
    out.append(f.rule, style="bold")
    out.append("  ")
    out.append(f.subject)  # node data: literal text
    out.append("\n\n")
    out.append(f.message + "\n")
    if f.evidence:
        out.append("\nEvidence\n", style="bold underline")
        for e in f.evidence:
            out.append(f"  {e.file}: ", style="dim")
            out.append(e.value + "\n")
    if f.fix:
        out.append("\nFix\n", style="bold underline")
        out.append(f"  {f.fix}\n", style="green")
    return out


class FindingScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("enter", "dismiss", "Close", show=False),
    ]

    def __init__(self, finding: Finding) -> None:
        super().__init__(id="finding-screen")
        self.finding = finding

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="finding"):
            yield Static(finding_text(self.finding))
        yield Footer()


class AuditView(Vertical):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "rerun", "Re-run audit", tooltip="run the audit again (not while one runs)")
    ]

    class Rerun(Message):
        """Ask the app to run the audit again."""

    def __init__(self) -> None:
        super().__init__(id="audit-view")
        self.report: AuditReport | None = None
        self.filter = ""

    def compose(self) -> ComposeResult:
        yield Static("Running gpujitter audit…", id="audit-note")
        table: DataTable[Text] = DataTable(id="audit-table", cursor_type="row", zebra_stripes=True)
        yield table

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)

    def show(self, report: AuditReport) -> None:
        self.report = report
        self.update_from_model()

    def update_from_model(self) -> None:
        report = self.report
        if report is None:
            return
        note = self.query_one("#audit-note", Static)
        table: DataTable[Text] = self.query_one(DataTable)
        table.clear()
        if report.error:
            note.update(Text(f"Audit unavailable: {report.error}", style="yellow"))
            return
        counts = {s: sum(f.severity == s for f in report.findings) for s in SEVERITY_MARK}
        summary = Text(f"Audit of {report.origin}: ")
        summary.append(", ".join(f"{n} {s}" for s, n in counts.items()))
        if report.note:
            summary.append(f"  ({report.note})", style="dim")
        note.update(summary)
        needle = self.filter.lower()
        for n, f in enumerate(report.findings):
            cells = [
                severity_text(f.severity),
                plain(f.rule),
                plain(f.subject),
                plain(f.message),
            ]
            if needle and needle not in " ".join(c.plain for c in cells).lower():
                continue
            table.add_row(*cells, key=str(n))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if self.report is not None and event.row_key.value is not None:
            self.app.push_screen(FindingScreen(self.report.findings[int(event.row_key.value)]))

    def action_rerun(self) -> None:
        self.query_one("#audit-note", Static).update("Running gpujitter audit…")
        self.post_message(self.Rerun())
