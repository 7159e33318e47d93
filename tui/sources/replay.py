"""Replay of a recording: a trace (`gpujitter record`) or an events file (`gaps --save-events`),
whose events go through StreamPipeline (the daemon's pipeline and node state), or an NDJSON file of
stream records (a captured socket stream, the attribution log). The records keep the
recording's order and play against a replay clock: play/pause, step, jump to the next gap,
seek (backwards starts the model over and plays up to the target at once), speed.

Commands arrive from the app's thread (ReplayControl) and are carried out on the worker's.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpujitter.errors import GpujitterError
from gpujitter.tui.inbox import ReplayPosition
from gpujitter.tui.sources import Receiver, Source

Record = Mapping[str, Any]
CHUNK = 5000  # records per hand-over (the inbox blocks a replay instead of dropping)
TICK_S = 0.05
GAP_KINDS = ("gpu.gap", "gpu.attribution")
ATTRIBUTION_WAIT_NS = 30 * 1_000_000_000  # how far past a gap its attribution is looked for
SPEEDS = (1 / 16, 256.0)


def emitted_at(rec: Record) -> int | None:
    """When the daemon publishes a record: a gap once it has ended, per-window statistics
    at the window's end, anything else at its timestamp; None for untimed messages."""
    if "end_ns" in rec:
        return int(rec["end_ns"])
    if "ts_ns" not in rec:
        return None
    return int(rec["ts_ns"]) + int(rec.get("interval_ns", 0))


def load_recording(path: Path) -> tuple[list[Record], list[Record]]:
    """(records that set the scene: the hello and snapshot before the first timed record;
    the rest, in the order they were sent or recorded)."""
    from gpujitter.daemon.offline.recordings import EVENTS, TRACE, sniff

    kind = sniff(path)
    records = _analysed(path) if kind in (TRACE, EVENTS) else _ndjson_records(path)
    scene: list[Record] = []
    rest: list[Record] = []
    for rec in records:
        if rec.get("type") in ("hello", "snapshot") and not rest:
            scene.append(rec)
        else:
            rest.append(rec)
    return scene, rest


def _ndjson_records(path: Path) -> Iterable[Record]:
    """A captured socket stream or the attribution log, through the log's reader: schema,
    torn last line and field types checked as for the daemon's own log."""
    from gpujitter.daemon.sinks.jsonlog import JsonLogReader
    from gpujitter.daemon.sinks.stream import STREAM_SCHEMA

    for n, rec in enumerate(JsonLogReader(path, stream_schema=STREAM_SCHEMA), 1):
        if not isinstance(rec.get("type"), str):
            raise GpujitterError(f"{path}:{n}: not a stream record (no type)")
        if rec["type"] != "hello":
            rec.pop("schema", None)  # the attribution log's per-line schema tag
        yield rec


def _analysed(path: Path) -> list[Record]:
    """A trace's or an events file's events through the daemon's pipeline, as live."""
    from gpujitter.daemon.analysis.pipeline import AnalysisConfig
    from gpujitter.daemon.offline.recordings import open_recording
    from gpujitter.tui.sources.pipeline import StreamPipeline

    traces = open_recording([path])
    header = traces.header
    pipeline = StreamPipeline(header.topology, AnalysisConfig.from_record(header.analysis))
    hello = {
        "type": "hello",
        "host": header.host,
        "kernel": header.kernel,
        "version": header.gpujitter,
        "clock": {"ts_ns": header.clock.ts_ns, "realtime_ns": header.clock.realtime_ns},
        "topology": header.topology.to_record(),
        "probes": list(header.probes),
    }
    return [hello, pipeline.snapshot(header.start_ns), *pipeline.feed(traces), *pipeline.flush()]


class ReplaySource(Source):
    """`at`: where to start ("start", "end" or monotonic ns); `playing`: start playing."""

    live = False

    def __init__(
        self, path: Path, *, at: str | int = "start", playing: bool = True, speed: float = 1.0
    ) -> None:
        self.path = Path(path)
        self.label = f"replay {self.path.name}"
        self.scene, self.records = load_recording(self.path)
        # Each record plays at its sending time; the order stays the recording's, so a
        # record timed before its predecessor (or not timed) plays with the predecessor.
        self.times: list[int] = []
        for rec in self.records:
            sent = emitted_at(rec) or 0
            self.times.append(max(sent, self.times[-1]) if self.times else sent)
        self.start_ns = self.times[0] if self.times else 0
        self.end_ns = self.times[-1] if self.times else 0
        if at == "start":
            self.at_ns = self.start_ns
        elif at == "end":
            self.at_ns = self.end_ns
        else:
            self.at_ns = int(at)
        self.playing = playing
        self.speed = speed
        self.cursor = 0  # records before it have been delivered
        self.replay = self
        self._commands: deque[Callable[[Receiver], None]] = deque()
        self._wake = threading.Event()

    # -- ReplayControl (the app's thread) ---------------------------------------------

    def _command(self, fn: Callable[[Receiver], None]) -> None:
        self._commands.append(fn)
        self._wake.set()

    def toggle(self) -> None:
        self._command(self._toggle)

    def step(self, ns: int) -> None:
        self._command(lambda sink: self._move(sink, self.at_ns + ns, playing=False))

    def next_gap(self) -> None:
        self._command(self._next_gap)

    def seek(self, at_ns: int) -> None:
        self._command(lambda sink: self._move(sink, at_ns, playing=self.playing))

    def faster(self, factor: float) -> None:
        self._command(lambda sink: self._set_speed(self.speed * factor))

    # -- the worker -------------------------------------------------------------------

    def run(self, sink: Receiver, stopped: Callable[[], bool]) -> None:
        sink.connection("replay", str(self.path))
        self._restart(sink)
        self._deliver_until(sink, self.at_ns)
        self._report(sink)
        last = time.monotonic()
        while not stopped():
            self._wake.wait(TICK_S)
            self._wake.clear()
            while self._commands:
                self._commands.popleft()(sink)
            now = time.monotonic()
            if self.playing:
                self._deliver_until(sink, self.at_ns + int((now - last) * 1e9 * self.speed))
                if self.cursor >= len(self.records):
                    self.playing = False
            last = now
            self._report(sink)
        sink.connection("stopped")

    def _report(self, sink: Receiver, selected: str | None = None) -> None:
        pos = ReplayPosition(
            at_ns=self.at_ns,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            playing=self.playing,
            speed=self.speed,
            done=self.cursor >= len(self.records),
        )
        sink.position(pos, selected)

    def _restart(self, sink: Receiver) -> None:
        sink.reset()
        sink.records(self.scene)
        self.cursor = 0

    def _deliver_until(self, sink: Receiver, at_ns: int) -> None:
        at_ns = min(max(at_ns, self.start_ns), self.end_ns)
        stop = bisect.bisect_right(self.times, at_ns)
        while self.cursor < stop:
            end = min(stop, self.cursor + CHUNK)
            sink.records(self.records[self.cursor : end])
            self.cursor = end
        self.at_ns = at_ns

    def _move(self, sink: Receiver, at_ns: int, *, playing: bool) -> None:
        if at_ns < self.at_ns:
            self._restart(sink)
        self._deliver_until(sink, at_ns)
        self.playing = playing and self.cursor < len(self.records)
        self._report(sink)

    def _toggle(self, sink: Receiver) -> None:
        self.playing = not self.playing and self.cursor < len(self.records)
        self._report(sink)

    def _set_speed(self, speed: float) -> None:
        self.speed = min(max(speed, SPEEDS[0]), SPEEDS[1])

    def _next_gap(self, sink: Receiver) -> None:
        """Play up to the next gap not yet shown (and its attribution), then pause there."""
        for n in range(self.cursor, len(self.records)):
            rec = self.records[n]
            if rec.get("type") in GAP_KINDS:
                break
        else:
            self.playing = False
            self._report(sink)
            return
        gap_id = f"{rec.get('gpu', 0)}:{rec.get('ts_ns', 0)}"
        target = self.times[n]
        for m in range(n + 1, len(self.records)):
            if self.times[m] > self.times[n] + ATTRIBUTION_WAIT_NS:
                break
            other = self.records[m]
            same = f"{other.get('gpu', 0)}:{other.get('ts_ns', 0)}" == gap_id
            if other.get("type") == "gpu.attribution" and same:
                target = self.times[m]
                break
        self._deliver_until(sink, target)
        self.playing = False
        self._report(sink, selected=gap_id)
