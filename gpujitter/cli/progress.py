"""How far an offline command (`report`, `export`, `trace`, `gaps --replay-events`) has read
its recording: a day of a busy node's traces is gigabytes, tens of minutes of replay, and
nothing else is said before the end. One line on standard error, refreshed about once a
second and erased when the reading ends (or is interrupted), as `record` shows its progress;
only on a terminal: a log or a pipe gets the result alone, and standard output is never
touched."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

from gpujitter.units import format_bytes

T = TypeVar("T")

# The clock is read once per this many events: reading one costs a few µs, so that is ~every
# 20 ms, and the loop itself pays nothing measurable.
CHECK_EVERY = 4096
REFRESH_S = 1.0


class Progress:
    """`with Progress(total) as p: for ev in p.events(recording, recording.position)`:
    "reading: 37% of 1.20GiB, 1234567 events" while the events are taken. `position` gives
    the bytes read so far, or None where that is not known (the events are counted then).
    `shown`: whether to show it at all (default: standard error is a terminal)."""

    def __init__(self, total: int, shown: bool | None = None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.shown = self.stream.isatty() if shown is None else shown
        self.total = total
        self.count = 0
        self.last = time.monotonic()
        self.written = False

    def events(self, events: Iterable[T], position: Callable[[], int | None]) -> Iterator[T]:
        if not self.shown:
            yield from events
            return
        for ev in events:
            self.count += 1
            if not self.count % CHECK_EVERY and time.monotonic() - self.last >= REFRESH_S:
                self.show(position())
            yield ev

    def show(self, done: int | None) -> None:
        self.last = time.monotonic()
        share = (
            f"{min(100 * done // self.total, 100)}% of {format_bytes(self.total)}, "
            if done is not None and self.total
            else ""
        )
        self.stream.write(f"\rreading: {share}{self.count} events\x1b[K")
        self.stream.flush()
        self.written = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.written:  # erased: what the command prints next starts on a clean line
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.written = False
