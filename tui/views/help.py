"""The help screen (`?`): every key of the app and of the view it was opened on, read from
their BINDINGS when it opens, so it says what the keys do today and cannot drift."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

KEY_W = 13


def expand(bindings: Iterable[BindingType]) -> list[Binding]:
    """Bindings as Textual reads them: one per key ("plus,equals_sign" is two)."""
    return list(Binding.make_bindings(bindings))


def help_text(sections: Iterable[tuple[str, list[tuple[str, str]]]]) -> Text:
    """Titled sections of (keys, what they do) rows."""
    out = Text()
    for n, (title, rows) in enumerate(sections):
        if not rows:
            continue
        if n:
            out.append("\n")
        out.append(title + "\n", style="bold underline")
        for keys, does in rows:
            out.append(f"  {keys:<{KEY_W}}", style="bold")
            out.append(does + "\n")
    return out


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close"),
    ]

    def __init__(self, text: Text) -> None:
        super().__init__(id="help-screen")
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(self.text, id="help-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "gpujitter top: keys (esc closes)"
