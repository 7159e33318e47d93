"""The breakdown of one gap (a modal screen): what the feeding threads' time went to, as a bar
of causes and a legend in ms and %, the evidence behind each cause, the threads (a waker with
the thread it woke, its hops from the critical thread and its own causes), and the remedy
lines; or, for a gap still being attributed, what is known of it so far."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from gpujitter.daemon.analysis.describe import evidence_line
from gpujitter.daemon.analysis.engine.causes import cause_colour, cause_label
from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.tui.text import WallClock, duration, gpu_title, ms, percent
from gpujitter.tui.views.timeline import cause_bar


def describe_gap(gap: GpuGap, clock: WallClock) -> Text:
    out = Text()
    out.append(f"{gpu_title(gap.gpu)} idle {duration(gap.dur_ns)}", style="bold")
    out.append(f"  {clock.date(gap.ts_ns)} {clock.time(gap.ts_ns)} → {clock.time(gap.end_ns)}\n")
    sources = ", ".join(gap.sources) or "unknown"
    out.append(f"placed by {sources} (±{duration(gap.resolution_ns)}), ", style="dim")
    out.append(f"confidence {gap.confidence:.2f}", style="dim")
    if gap.tgids:
        out.append(f"  feeding pids {', '.join(map(str, gap.tgids))}", style="dim")
    return out


def breakdown_text(gap: GpuGap, a: Attribution | None, clock: WallClock, width: int) -> Text:
    out = describe_gap(gap, clock)
    out.append("\n")
    if a is None:
        out.append("\nNot attributed yet: the engine waits for the probes' data about the gap.\n")
        return out
    if a.tid:
        out.append("critical thread ")
        out.append(a.comm or "?", style="bold")  # untrusted name, appended literally
        out.append(f"  tid {a.tid}, pid {a.tgid}")
    if a.workload:
        out.append("  in ")
        out.append(a.workload, style="bold")  # names from the runtime's files: decoded inert
    if a.gpu_node >= 0:
        out.append(f"  GPU node {a.gpu_node}")
    out.append("\n\n")
    out.append_text(cause_bar([(p.cause, p.ns) for p in a.parts], max(width, 10)))
    out.append("\n\n")
    label_w = max((len(cause_label(p.cause)) for p in a.parts), default=10)
    for part in a.parts:
        out.append(
            f"{cause_label(part.cause):<{label_w}}", style=f"bold {cause_colour(part.cause)}"
        )
        out.append(f" {ms(part.ns):>7} ms {percent(part.ns, gap.dur_ns):>5}\n")
    evidence = [(p, evidence_line(e, a.ts_ns)) for p in a.parts for e in p.evidence]
    if evidence:
        out.append("\nEvidence\n", style="bold underline")
        for part, line in evidence:
            out.append(f"  {cause_label(part.cause):<{label_w}}  ", style=cause_colour(part.cause))
            out.append(line + "\n")
    if a.threads:
        out.append("\nThreads\n", style="bold underline")
        for t in a.threads:
            out.append(f"  {t.role:<9}")
            out.append(t.comm or "?", style="bold")
            out.append(f"  tid {t.tid} pid {t.tgid}  {duration(t.ns)}")
            if t.workload and t.workload != a.workload:
                out.append(f"  in {t.workload}", style="dim")
            if t.hops:
                out.append(f"  woke tid {t.woke}, {t.hops} hop{'s' if t.hops != 1 else ''}")
            elif t.top_cause:
                out.append(f"  mostly {cause_label(t.top_cause)}", style="dim")
            out.append("\n")
            if t.hops and t.causes:
                # A waker's own time: what the wait it ended went to (a worker's host work).
                own = ", ".join(f"{cause_label(c.cause)} {duration(c.ns)}" for c in t.causes)
                out.append(f"{'':11}{own}\n", style="dim")
    if a.remedies:
        out.append("\nRemedy\n", style="bold underline")
        for line in a.remedies:
            out.append("  ")
            out.append(line + "\n", style="green")
    if a.probes_off:
        out.append(
            f"\nProbes off at the time (their causes cannot be seen): {', '.join(a.probes_off)}\n",
            style="yellow",
        )
    return out


class GapScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("enter", "dismiss", "Close", show=False),
    ]

    def __init__(self, gap: GpuGap, a: Attribution | None, clock: WallClock) -> None:
        super().__init__(id="gap-screen")
        self.gap = gap
        self.attribution = a
        self.clock = clock

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="breakdown"):
            yield Static(id="breakdown-text")
        yield Footer()

    def on_mount(self) -> None:
        title = f"{gpu_title(self.gap.gpu)} gap at {self.clock.time(self.gap.ts_ns)}"
        self.query_one("#breakdown").border_title = title
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def show(self, gap: GpuGap, a: Attribution | None) -> None:
        """The gap as the model now holds it: its attribution arrived while this was open."""
        if gap is not self.gap or a is not self.attribution:  # the model's, new when changed
            self.gap, self.attribution = gap, a
            self._draw()

    def _draw(self) -> None:
        # Leave room for the scrollbar a long breakdown brings, so the bar never wraps.
        width = (self.query_one("#breakdown-text").content_size.width or 62) - 2
        text = breakdown_text(self.gap, self.attribution, self.clock, width)
        self.query_one("#breakdown-text", Static).update(text)
