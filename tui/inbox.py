"""The hand-off between a feed's worker thread and the app: bounded, so a slow terminal
never slows the daemon (the socket keeps being read; what does not fit is dropped and
counted), and coalescing, so a flood costs the UI one wake-up and only the latest value of
each state record.

Two lanes. State records that a newer one makes obsolete (a CPU's statistics, a probe's
health, the daemon's status, a GPU's processes) wait in a dict keyed by what they describe:
a newer one replaces the older (counted as coalesced). Everything else (gaps, attributions,
samples, the hello and snapshot) waits in a FIFO of `limit` records; when it is full a live
feed's record is dropped and counted by type, a replay's worker waits instead (a replay
must not lose records, and has no daemon to hold up). The app is woken once per batch: the
worker calls `notify` only when no wake-up is pending.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Record = Mapping[str, Any]


def state_key(rec: Record) -> Hashable | None:
    """What a state record describes (its newer version replaces it); None for the rest."""
    kind = rec.get("type")
    if kind == "cpu.stats":
        # The irq and the cstate probes send separate halves for the same CPU.
        return (kind, rec.get("cpu"), bool(rec.get("idle_ns")))
    if kind == "meta.probe":
        return (kind, rec.get("probe"))
    if kind == "gpu.procs":
        return (kind, rec.get("gpu"))
    if kind == "daemon.status":
        return (kind,)
    return None


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the data comes from and how that is going. state: connecting, connected,
    waiting (no daemon; retrying), embedded, replay, stopped, failed."""

    state: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReplayPosition:
    at_ns: int
    start_ns: int
    end_ns: int
    playing: bool
    speed: float
    done: bool = False  # the cursor reached the end of the recording


@dataclass(slots=True)
class Batch:
    reset: bool = False  # forget what the model holds before applying records
    records: list[Record] = field(default_factory=list)
    connection: Connection | None = None
    position: ReplayPosition | None = None
    selected_gap: str | None = None  # a replay jumped to this gap
    more: bool = False  # records remain: take again


class Inbox:
    def __init__(
        self, limit: int = 50_000, *, block: bool = False, notify: Callable[[], None] = lambda: None
    ) -> None:
        self.limit = limit
        self.block = block
        self.notify = notify
        self._cond = threading.Condition()
        self._fifo: deque[Record] = deque()
        self._state: dict[Hashable, Record] = {}
        self._reset = False
        self._connection: Connection | None = None
        self._position: ReplayPosition | None = None
        self._selected: str | None = None
        self._pending = False  # a wake-up is on its way to the app
        self._closed = False
        self.dropped: Counter[str] = Counter()
        self.coalesced = 0

    # -- the worker's side (Receiver) ---------------------------------------------------

    def records(self, records: Iterable[Record]) -> None:
        with self._cond:
            for rec in records:
                key = state_key(rec)
                if key is not None:
                    if key in self._state:
                        self.coalesced += 1
                    self._state[key] = rec
                    continue
                while self.block and len(self._fifo) >= self.limit and not self._closed:
                    self._wake_locked()
                    self._cond.wait(0.1)
                if self._closed:
                    return
                if len(self._fifo) >= self.limit:
                    self.dropped[str(rec.get("type"))] += 1
                    continue
                self._fifo.append(rec)
            self._wake_locked()

    def reset(self) -> None:
        with self._cond:
            self._fifo.clear()
            self._state.clear()
            self._reset = True
            self._wake_locked()

    def connection(self, state: str, detail: str = "") -> None:
        with self._cond:
            if self._connection is None or (state, detail) != (
                self._connection.state,
                self._connection.detail,
            ):
                self._connection = Connection(state, detail)
            self._wake_locked()

    def position(self, pos: ReplayPosition, selected_gap: str | None = None) -> None:
        with self._cond:
            if pos == self._position and selected_gap is None:
                return  # a paused replay reports each tick: redrawing for it kept the app busy
            self._position = pos
            if selected_gap is not None:
                self._selected = selected_gap
            self._wake_locked()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake_locked(self) -> None:
        if not self._pending and not self._closed:
            self._pending = True
            self.notify()

    # -- the app's side -------------------------------------------------------------

    def take(self, limit: int = 5000) -> Batch:
        """Up to `limit` FIFO records, then every waiting state record, in arrival order
        within each lane; plus the latest connection and replay position."""
        with self._cond:
            batch = Batch(reset=self._reset, position=self._position, selected_gap=self._selected)
            batch.connection = self._connection
            self._reset = False
            self._selected = None
            n = min(limit, len(self._fifo))
            batch.records = [self._fifo.popleft() for _ in range(n)]
            if not self._fifo:
                batch.records += self._state.values()
                self._state.clear()
            batch.more = bool(self._fifo)
            self._pending = batch.more
            self._cond.notify_all()
            return batch

    @property
    def pending(self) -> bool:
        """Something waits for the app (records, or a wake-up not yet taken)."""
        with self._cond:
            return bool(self._fifo or self._state or self._pending)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())
