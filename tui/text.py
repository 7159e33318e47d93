"""Text for the screen: untrusted strings made inert, times and durations as people read them.

Process names, command lines, IRQ names and audit values come from the node and may hold
anything, including Textual markup ("[@click=quit]") and terminal control sequences (a name
"ESC ] 0;title BEL" sets the terminal's title). Two rules keep them inert: every string
decoded from a record is printable (tui.decode, tui.audit, the model's hello: control
characters escaped by gpujitter.text.printable), and such strings reach a widget only as
rich Text (`plain()`, `join()`, `Text.append` with a style), never parsed as markup.
`plain()` and `join()` escape again (idempotent), for text that came another way.
"""

from __future__ import annotations

from datetime import datetime, tzinfo

from rich.text import Text

from gpujitter.text import printable
from gpujitter.units import format_ns


def plain(value: object, style: str = "") -> Text:
    """`value` as literal text: brackets stay brackets."""
    return Text(printable(str(value)), style=style, no_wrap=True, overflow="ellipsis")


def join(*parts: tuple[object, str] | str | Text, sep: str = "") -> Text:
    """Concatenate literal parts; a (value, style) pair is styled literal text."""
    out = Text(no_wrap=True, overflow="ellipsis")
    for n, part in enumerate(parts):
        if n and sep:
            out.append(sep)
        if isinstance(part, tuple):
            out.append(printable(str(part[0])), style=part[1])
        elif isinstance(part, Text):
            out.append_text(part)
        else:
            out.append(printable(part))
    return out


def gpu_title(index: int) -> str:
    """How the views name a GPU: "GPU 0"; "GPU ?" for -1, a gap or process on no known GPU
    (no NVML, or a process NVML lists on none)."""
    return f"GPU {gpu_number(index)}"


def gpu_number(index: int) -> str:
    """A GPU's index where a column says it is a GPU: "0"; "?" for -1, as gpu_title."""
    return str(index) if index >= 0 else "?"


def duration(ns: int | float) -> str:
    return format_ns(ns)


def ms(ns: int | float) -> str:
    """Milliseconds with precision that fits a column: 0.04, 1.23, 12.3, 123."""
    value = ns / 1e6
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def percent(part: float, whole: float) -> str:
    if whole <= 0:
        return "-"
    return f"{100 * part / whole:.0f}%"


class WallClock:
    """Monotonic ns -> local wall time, through the clock reference the stream's hello (or the
    trace header) carries: wall = realtime_ns + (t - ts_ns). `tz` None is the local zone;
    tests pass UTC so that screens do not depend on where they run."""

    def __init__(self, ts_ns: int = 0, realtime_ns: int = 0, tz: tzinfo | None = None) -> None:
        self.ts_ns = ts_ns
        self.realtime_ns = realtime_ns
        self.tz = tz

    @property
    def known(self) -> bool:
        return self.realtime_ns != 0

    def wall_ns(self, mono_ns: int) -> int:
        return self.realtime_ns + (mono_ns - self.ts_ns)

    def wall_time(self, mono_ns: int) -> datetime | None:
        """The wall time, None where it is not one a datetime holds (a clock reference from a
        damaged stream or trace, years past 9999): such times are shown relative."""
        if not self.known:
            return None
        try:
            wall = datetime.fromtimestamp(self.wall_ns(mono_ns) / 1e9, tz=self.tz)
            return wall.astimezone(self.tz)
        except (ValueError, OverflowError, OSError):
            return None

    def time(self, mono_ns: int, digits: int = 3) -> str:
        """12:01:07.250 (digits of the second's fraction: 0, 3 or 6)."""
        dt = self.wall_time(mono_ns)
        if dt is None:
            return f"+{mono_ns / 1e9:.{digits}f}s"
        text = dt.strftime("%H:%M:%S.%f")
        return text[: len(text) - 6 + digits].rstrip(".")

    def date(self, mono_ns: int) -> str:
        dt = self.wall_time(mono_ns)
        return "" if dt is None else dt.strftime("%Y-%m-%d")

    def mono_of(self, wall: datetime) -> int:
        """The monotonic ns of a wall time (for seeking by clock time)."""
        return self.ts_ns + round(wall.timestamp() * 1e9) - self.realtime_ns
