"""`gpujitter top`: the live view of a node's GPUs, their idle gaps and why, its CPUs and its
tuning audit; the same views over a recording in replay.

The app is handed a Feed and never touches a socket or a probe itself: the feed runs in
a thread worker and fills an Inbox, which wakes the app with one RecordsReady message per
batch (later ones coalesce into it); the app folds the batch into the NodeModel and redraws
the visible view. Every key is a Binding below (`?` lists them from there, and the command
palette offers them with the sorts and filters); the app may also be handed an Offer, a
recording to replay in its place (the first screen of a node without a GPU offers one).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import tzinfo
from functools import partial
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from gpujitter.daemon.analysis.engine.causes import CAUSE_ORDER
from gpujitter.errors import GpujitterError
from gpujitter.text import printable
from gpujitter.tui.audit import AuditReport
from gpujitter.tui.feeds import Feed
from gpujitter.tui.inbox import Connection, Inbox, ReplayPosition
from gpujitter.tui.model import NodeModel
from gpujitter.tui.text import WallClock, join
from gpujitter.tui.views.audit import AuditView
from gpujitter.tui.views.breakdown import GapScreen
from gpujitter.tui.views.cpus import CpusTable
from gpujitter.tui.views.gaps import SORTS, GapsTable
from gpujitter.tui.views.gpus import GpusView, no_gpu_note
from gpujitter.tui.views.help import HelpScreen, expand, help_text
from gpujitter.tui.views.status import status_text
from gpujitter.units import parse_duration_ns

VIEWS = ("gpus", "gaps", "cpus", "audit")
REPLAY_ACTIONS = {"next_gap", "seek", "step", "speed"}
STEP_NS = 1_000_000_000
PALETTE_SKIP = {"quit", "open", "close_prompt", "help"}  # Textual's own, or need a row
HEARD = {"hello", "snapshot", "daemon.status"}  # what says a daemon still sends (once a second)


@dataclass(frozen=True, slots=True)
class Offer:
    """A recording the app offers to replay in place of its live feed: `command` is how
    to open it from a shell, `open` builds its feed."""

    command: str
    open: Callable[[], Feed]


class RecordsReady(Message):
    """The inbox holds records. A newer one supersedes a waiting one (the handler drains
    everything there is), so a flood costs one wake-up."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RecordsReady)


def seek_target(text: str, clock: WallClock, pos: ReplayPosition) -> int:
    """Where a seek goes: "12:01:07[.250]" (wall clock, on the recording's day), "+10s" /
    "-1m" (from here), "50%" (of the recording), "start" or "end". Monotonic ns."""
    text = text.strip()
    if text in ("start", "end"):
        return pos.start_ns if text == "start" else pos.end_ns
    if text.endswith("%"):
        try:
            share = float(text[:-1]) / 100
        except ValueError:
            raise GpujitterError(f"bad position {text!r}") from None
        if not 0 <= share <= 1:  # nan and inf too
            raise GpujitterError(f"bad position {text!r}: want 0% to 100%")
        return pos.start_ns + round((pos.end_ns - pos.start_ns) * share)
    if text[:1] in "+-" and len(text) > 1:
        sign = -1 if text[0] == "-" else 1
        return pos.at_ns + sign * parse_duration_ns(text[1:], "s")
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?", text) and (
        day := clock.wall_time(pos.at_ns)
    ):
        parts = text.split(":")
        seconds = float(parts[2]) if len(parts) > 2 else 0.0
        try:
            wall = day.replace(
                hour=int(parts[0]),
                minute=int(parts[1]),
                second=int(seconds),
                microsecond=min(round((seconds % 1) * 1e6), 999_999),
            )
        except ValueError as err:  # 25:00, 12:61
            raise GpujitterError(f"cannot seek to {text!r}: {err}") from None
        return clock.mono_of(wall)
    raise GpujitterError(
        f"cannot seek to {text!r}: want HH:MM:SS[.ms], +10s, -1m, 50%, start or end"
    )


class GpujitterTop(App[None]):
    """The app. `feed`: where records come from; `audit`: what fills the Audit view
    (called in a worker thread); `tz`: the zone for wall times (None: local)."""

    CSS_PATH = "app.tcss"
    TITLE = "gpujitter top"
    # The tooltip is what `?` says a key does.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", tooltip="quit"),
        Binding("question_mark", "help", "Help", tooltip="this list of keys"),
        Binding("tab", "switch_view(1)", "Next view", priority=True, tooltip="next view"),
        Binding("shift+tab", "switch_view(-1)", "Previous view", show=False, priority=True,
                tooltip="previous view"),
        Binding("1", "view('gpus')", "GPUs", show=False, tooltip="the GPUs view"),
        Binding("2", "view('gaps')", "Gaps", show=False, tooltip="the Gaps view"),
        Binding("3", "view('cpus')", "CPUs", show=False, tooltip="the CPUs view"),
        Binding("4", "view('audit')", "Audit", show=False, tooltip="the Audit view"),
        Binding("enter", "open", "Open",
                tooltip="open the selected gap (its breakdown) or audit finding"),
        Binding("slash", "filter", "Filter",
                tooltip="filter the current view on any column's text (enter keeps it)"),
        Binding("escape", "close_prompt", "Close", show=False,
                tooltip="close the breakdown, a finding or the prompt; clear the filter"),
        Binding("p", "pause", "Pause",
                tooltip="live: freeze the display (data keeps coming); replay: play / pause"),
        Binding("plus,equals_sign", "zoom(-1)", "Zoom in", show=False,
                tooltip="GPU timelines: a shorter window (down to 10 s)"),
        Binding("minus", "zoom(1)", "Zoom out", show=False,
                tooltip="GPU timelines: a longer window (up to 10 min)"),
        Binding("n", "next_gap", "Next gap",
                tooltip="replay: play to the next gap and its attribution, then pause"),
        Binding("full_stop", "step(1)", "Step", tooltip="replay: one second forward"),
        Binding("comma", "step(-1)", "Step back", show=False,
                tooltip="replay: one second back"),
        Binding("g", "seek", "Seek",
                tooltip="replay: seek to HH:MM:SS[.ms], +10s, -1m, 50%, start or end"),
        Binding("greater_than_sign", "speed(2)", "Faster", show=False,
                tooltip="replay: twice as fast"),
        Binding("less_than_sign", "speed(0.5)", "Slower", show=False,
                tooltip="replay: half as fast"),
        Binding("e", "example", "Example", show=False,
                tooltip="live, no GPU seen: replay the example recording here"),
    ]  # fmt: skip

    def __init__(
        self,
        feed: Feed,
        *,
        audit: Callable[[], AuditReport] | None = None,
        tz: tzinfo | None = None,
        inbox_limit: int = 50_000,
        example: Offer | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.feed = feed
        self.audit_loader = audit
        self.example = example
        self.model = NodeModel(WallClock(tz=tz))
        self.inbox_limit = inbox_limit
        self.inbox = Inbox(inbox_limit, block=not feed.live, notify=self._wake)
        self.connection: Connection | None = None
        self.position: ReplayPosition | None = None
        self.paused = False
        self.dirty: set[str] = set()
        self.prompt_mode = ""  # "filter" or "seek" while the prompt is open
        self._stopping = False
        self._auditing = False  # an audit runs: `r` waits for it rather than start another
        # When the daemon's status (or the hello and snapshot) last came, on this machine's
        # clock: a daemon that stops sending looks connected, so the status line says how
        # long it has been silent.
        self._heard_at = time.monotonic()

    # -- layout ---------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        with TabbedContent(initial="gpus", id="views"):
            with TabPane("GPUs", id="gpus"):
                offer = self.example.command if self.example and self.feed.live else None
                yield GpusView(self.model, no_gpu_note(offer, live=self.feed.live))
            with TabPane("Gaps", id="gaps"):
                yield GapsTable(self.model)
            with TabPane("CPUs", id="cpus"):
                yield CpusTable(self.model)
            with TabPane("Audit", id="audit"):
                yield AuditView()
        yield Input(id="prompt")
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.main.query_one("#prompt").display = False
        self._draw_title()
        self._pump()
        self._load_audit()
        self.set_interval(1.0, self._draw_status)  # the silence of a stalled daemon grows

    def _wake(self) -> None:
        """Called on the feed's thread (post_message is thread-safe)."""
        self.post_message(RecordsReady())

    def on_unmount(self) -> None:
        self._stopping = True
        self.inbox.close()

    # -- the feed's worker --------------------------------------------------------

    @work(thread=True, exit_on_error=False, name="feed")
    def _pump(self) -> None:
        feed, inbox = self.feed, self.inbox  # a switch of feed leaves this pair behind
        try:
            feed.run(inbox, lambda: self._stopping or inbox.closed)
        except Exception as err:  # a feed that breaks says so; the app stays up
            inbox.connection("failed", f"{type(err).__name__}: {err}")

    def switch_feed(self, feed: Feed) -> None:
        """Show `feed` instead: the old one's inbox closes (its worker ends), the model
        starts over."""
        self.inbox.close()
        self.feed = feed
        self.inbox = Inbox(self.inbox_limit, block=not feed.live, notify=self._wake)
        self.model.reset()
        self.connection = self.position = None
        self.paused = False
        self.dirty |= set(VIEWS)
        self._pump()
        self._redraw(force=True)

    def on_records_ready(self, _message: RecordsReady) -> None:
        if self.screen_stack:  # (empty while the app exits)
            with contextlib.suppress(NoMatches):  # an exit under way removes the widgets
                self._take_batch()

    def _take_batch(self) -> None:
        batch = self.inbox.take()
        if batch.reset:
            self.model.reset()
        self.model.apply_all(batch.records)
        if batch.connection != self.connection or any(
            r.get("type") in HEARD for r in batch.records
        ):
            self._heard_at = time.monotonic()
        self.connection = batch.connection
        self.position = batch.position
        if batch.more:
            self.post_message(RecordsReady())
        changes = self.model.take_changes()
        self.dirty |= changes
        self._redraw()
        if isinstance(self.screen, GapScreen) and "gaps" in changes:
            open_gap = self.screen.gap.gap_id
            gap = self.model.gaps.get(open_gap, self.screen.gap)
            self.screen.show(gap, self.model.attributions.get(open_gap))
        if batch.selected_gap is not None:
            self.action_view("gaps")
            self.main.query_one(GapsTable).select_gap(batch.selected_gap)

    # -- drawing --------------------------------------------------------------------

    @property
    def main(self) -> Screen[None]:
        """The screen the views live on (a breakdown may be open over it)."""
        return self.screen_stack[0]

    @property
    def active_view(self) -> str:
        return self.main.query_one(TabbedContent).active or "gpus"

    def _redraw(self, force: bool = False) -> None:
        """Redraw the visible view if its data changed (unless paused), and the status."""
        view = self.active_view
        if force or (not self.paused and view in self.dirty):
            self.dirty.discard(view)
            self._view_widget(view).update_from_model()
        self._draw_title()
        self._draw_status()

    def _draw_status(self) -> None:
        # Also the 1 s timer's: it can fire while the screen's widgets are being torn down
        # (the app quitting), when the status line is gone.
        found = self.main.query("#status").results(Static)
        status = next(found, None)
        if status is None:
            return
        connected = self.connection is not None and self.connection.state == "connected"
        status.update(
            status_text(
                self.model,
                self.connection,
                self.position,
                inbox_dropped=self.inbox.dropped_total,
                paused=self.paused,
                filter_text=self._view_widget(self.active_view).filter,
                bad_lines=self.feed.bad_lines,
                silent_s=time.monotonic() - self._heard_at if connected else None,
            )
        )

    def _view_widget(self, view: str) -> GpusView | GapsTable | CpusTable | AuditView:
        if view == "gaps":
            return self.main.query_one(GapsTable)
        if view == "cpus":
            return self.main.query_one(CpusTable)
        if view == "audit":
            return self.main.query_one(AuditView)
        return self.main.query_one(GpusView)

    def _draw_title(self) -> None:
        h = self.model.hello
        parts: list[tuple[object, str] | str] = [("gpujitter top", "bold")]
        if h.host:
            parts.append((h.host, "bold cyan"))  # a host name is node data: literal text
        if h.kernel:
            parts.append((h.kernel, "dim"))
        parts.append((self.feed.label, "dim"))
        if h.override:
            parts.append((f"topology override {h.override}", "bold yellow"))
        self.main.query_one("#title", Static).update(join(*parts, sep="  "))

    @on(TabbedContent.TabActivated)
    def _view_shown(self, event: TabbedContent.TabActivated) -> None:
        view = self.active_view
        with contextlib.suppress(NoMatches):  # an exit under way removes the widgets
            self._redraw(force=view in self.dirty and not self.paused)
            self._focus_view()

    # -- the audit ------------------------------------------------------------------

    def _load_audit(self) -> None:
        """Run the audit, unless one runs: a thread cannot be cancelled, so a second would
        run beside it (a `gpujitter audit` process each), and the older could finish last."""
        if self._auditing:
            self.notify("audit already running", markup=False)
            return
        self._auditing = True
        self._audit()

    @work(thread=True, group="audit", exit_on_error=False)
    def _audit(self) -> None:
        try:
            if self.audit_loader is None:
                report = AuditReport(error="no audit for this feed")
            else:
                try:
                    report = self.audit_loader()
                except GpujitterError as err:
                    report = AuditReport(error=str(err))
            if not self._stopping:
                self.call_from_thread(self.main.query_one(AuditView).show, report)
        finally:
            self._auditing = False

    @on(AuditView.Rerun)
    def _rerun_audit(self) -> None:
        self._load_audit()

    # -- actions --------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in REPLAY_ACTIONS:
            return self.feed.replay is not None
        if action == "example":
            return self.example is not None and self.feed.live
        return True

    def key_rows(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """What `?` lists: the app's keys (Textual's own among them), then the active view's,
        from their BINDINGS (keys of one action on one row)."""
        view = self._view_widget(self.active_view)
        own = vars(type(view)).get("BINDINGS", [])
        textual = [b for b in expand(App.BINDINGS) if b.description and not b.system]
        palette = Binding(self.COMMAND_PALETTE_BINDING, "command_palette", "", tooltip=(
            "the command palette: views, sorts, filters, replay controls, by name"
        ))  # fmt: skip
        return [
            ("Everywhere", self._rows([*expand(self.BINDINGS), palette, *textual])),
            (f"In the {self.active_view.capitalize()} view", self._rows(expand(own))),
            ("Moving", [("arrows, pgup", "move in a view (pgdn, home, end and the mouse too)")]),
        ]

    def _rows(self, bindings: Iterable[Binding]) -> list[tuple[str, str]]:
        keys: dict[str, list[str]] = {}
        does: dict[str, str] = {}
        for b in bindings:
            keys.setdefault(b.action, []).append(self.get_key_display(b))
            does.setdefault(b.action, b.tooltip or b.description)
        return [(" ".join(keys[action]), does[action]) for action in keys]

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_text(self.key_rows())))

    def action_example(self) -> None:
        if self.example is not None and self.feed.live:
            self.switch_feed(self.example.open())

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """The palette: Textual's commands, then every key's action by name (those the
        feed can do), each gaps order, and a filter per cause."""
        yield from super().get_system_commands(screen)
        for b in expand(self.BINDINGS):
            name = b.action.partition("(")[0]
            if name in PALETTE_SKIP or not self.check_action(name, ()):
                continue
            help_line = b.tooltip or b.description
            yield SystemCommand(b.description, help_line, partial(self.run_action, b.action))
        for sort, (_column, reads, _key) in SORTS.items():
            yield SystemCommand(
                f"Sort gaps by {sort}", f"the Gaps view, {reads}", partial(self.sort_gaps, sort)
            )
        for label in (c.label for c in CAUSE_ORDER):
            yield SystemCommand(
                f"Filter gaps: {label}",
                f"the Gaps view, only the gaps whose row says {label}",
                partial(self.filter_gaps, label),
            )
        yield SystemCommand(
            "Clear the filter", "this view, every row", partial(self._set_filter, "")
        )

    def sort_gaps(self, sort: str) -> None:
        self.action_view("gaps")
        self.main.query_one(GapsTable).sort_by(sort)

    def filter_gaps(self, text: str) -> None:
        self.action_view("gaps")
        self._set_filter(text)

    def action_switch_view(self, step: int) -> None:
        if self.prompt_mode:
            return
        n = VIEWS.index(self.active_view)
        self.action_view(VIEWS[(n + step) % len(VIEWS)])

    def action_view(self, view: str) -> None:
        self.main.query_one(TabbedContent).active = view

    def action_open(self) -> None:
        view = self._view_widget(self.active_view)
        if isinstance(view, GapsTable) and view.row_count:
            view.action_select_cursor()
        elif isinstance(view, AuditView):
            view.query_one(DataTable).action_select_cursor()

    @on(GapsTable.Open)
    def _open_gap(self, event: GapsTable.Open) -> None:
        gap = self.model.gaps.get(event.gap_id)
        if gap is not None:
            self.push_screen(
                GapScreen(gap, self.model.attributions.get(gap.gap_id), self.model.clock)
            )

    def action_pause(self) -> None:
        if self.feed.replay is not None:
            self.feed.replay.toggle()
            return
        self.paused = not self.paused
        self._redraw(force=not self.paused)

    def action_next_gap(self) -> None:
        if self.feed.replay is not None:
            self.feed.replay.next_gap()

    def action_step(self, direction: int) -> None:
        if self.feed.replay is not None:
            self.feed.replay.step(direction * STEP_NS)

    def action_speed(self, factor: float) -> None:
        if self.feed.replay is not None:
            self.feed.replay.faster(factor)

    def action_zoom(self, step: int) -> None:
        self.main.query_one(GpusView).zoom(step)

    def action_filter(self) -> None:
        view = self._view_widget(self.active_view)
        self._open_prompt("filter", view.filter, "filter this view (enter keeps it, esc clears)")

    def action_seek(self) -> None:
        self._open_prompt("seek", "", "seek to HH:MM:SS[.ms], +10s, -1m, 50%, start or end")

    def _open_prompt(self, mode: str, value: str, placeholder: str) -> None:
        prompt = self.main.query_one("#prompt", Input)
        self.prompt_mode = mode
        prompt.placeholder = placeholder
        prompt.value = value
        prompt.display = True
        prompt.focus()

    def action_close_prompt(self) -> None:
        """Esc: close the prompt; clear the view's filter, whether the prompt is open on it
        or it was kept with enter (the view's title says esc clears it)."""
        if self.prompt_mode in ("filter", "") and self._view_widget(self.active_view).filter:
            self._set_filter("")
        self._close_prompt()

    def _close_prompt(self) -> None:
        self.prompt_mode = ""
        prompt = self.main.query_one("#prompt", Input)
        prompt.display = False
        self._focus_view()

    def _focus_view(self) -> None:
        widget = self._view_widget(self.active_view)
        (widget.query_one(DataTable) if isinstance(widget, AuditView) else widget).focus()

    def _set_filter(self, text: str) -> None:
        view = self._view_widget(self.active_view)
        view.filter = text
        view.update_from_model()
        self._redraw()

    @on(Input.Changed, "#prompt")
    def _prompt_changed(self, event: Input.Changed) -> None:
        if self.prompt_mode == "filter":
            self._set_filter(event.value)

    @on(Input.Submitted, "#prompt")
    def _prompt_submitted(self, event: Input.Submitted) -> None:
        if self.prompt_mode == "seek" and self.feed.replay and self.position:
            try:
                self.feed.replay.seek(seek_target(event.value, self.model.clock, self.position))
            except GpujitterError as err:
                self.notify(printable(str(err)), severity="error", markup=False)
        self._close_prompt()
