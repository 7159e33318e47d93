"""Where the app's records come from, behind one interface (live and recorded feeds look
the same to the app, as Falco's engines and memray's readers do): the daemon's socket, the
probes run in-process when no daemon runs, or a recording replayed.

A feed's `run` is called in a worker thread and hands records (docs/schema.md "Socket
messages") to a Receiver until `stopped()` says to end. Replay feeds also take commands from
the app (play, pause, step, seek) through `replay`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from gpujitter.tui.inbox import ReplayPosition

Record = Mapping[str, Any]


class Receiver(Protocol):
    """What a feed hands its output to (tui.inbox.Inbox)."""

    def records(self, records: Iterable[Record]) -> None: ...

    def reset(self) -> None: ...

    def connection(self, state: str, detail: str = "") -> None: ...

    def position(self, pos: ReplayPosition, selected_gap: str | None = None) -> None: ...


class ReplayControl(Protocol):
    """Commands a replay takes from the app's thread; each returns at once."""

    def toggle(self) -> None: ...

    def step(self, ns: int) -> None: ...

    def next_gap(self) -> None: ...

    def seek(self, at_ns: int) -> None: ...

    def faster(self, factor: float) -> None: ...


class Feed(abc.ABC):
    label: str = ""  # what the title bar says the data is ("daemon", "embedded", a file)
    live: bool = True  # live feeds may drop under load; a replay's inbox blocks instead
    replay: ReplayControl | None = None
    bad_lines: int = 0  # input lines that were no record (not JSON, too long): skipped

    @abc.abstractmethod
    def run(self, sink: Receiver, stopped: Callable[[], bool]) -> None:
        """Deliver records until stopped() is true (polled at least every 0.25 s)."""
