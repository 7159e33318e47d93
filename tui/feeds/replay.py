"""Replay of a recording, read as it plays (memory does not grow with its length): a trace
(`gpujitter record`, a rotated directory) or an events file (`gaps --save-events`), whose
events go through the daemon's runtime stepped by the replay (its pipeline and node state,
as live), or an NDJSON file of stream records (a captured socket stream, the attribution
log, `run --json`'s output). The records keep the recording's order and play against a
replay clock: play/pause, step, jump to the next gap, seek (backwards reads the recording
again from its start and plays up to the target at once), speed.

Commands arrive from the app's thread (ReplayControl) and are carried out on the worker's.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpujitter.daemon.offline.recordings import EVENTS, PRINTED, TRACE, WHAT, sniff
from gpujitter.tui.feeds import Feed, Receiver
from gpujitter.tui.inbox import ReplayPosition

Record = Mapping[str, Any]
CHUNK = 5000  # records per hand-over (the inbox blocks a replay instead of dropping)
TICK_S = 0.05
GAP_KINDS = ("gpu.gap", "gpu.attribution")
ATTRIBUTION_WAIT_NS = 30 * 1_000_000_000  # how far past a gap its attribution is looked for
SPEEDS = (1 / 16, 256.0)
SCENE_KINDS = ("hello", "snapshot")
_TIMES = ("ts_ns", "end_ns", "interval_ns")  # what emitted_at reads

# How the first pass's reading is shown (`gpujitter top`: a progress line before the app
# starts): given what is read (a trace's or an events file's events, an NDJSON file's
# records), how far the reading is (bytes, None where not known) and the recording's size,
# it passes on what is read.
Watch = Callable[[Iterable[Any], Callable[[], int | None], int], Iterable[Any]]


def unwatched(items: Iterable[Any], position: Callable[[], int | None], size: int) -> Iterable[Any]:
    return items


def emitted_at(rec: Record) -> int | None:
    """When the daemon publishes a record: a gap once it has ended, per-window statistics
    at the window's end, anything else at its timestamp; None for untimed messages."""
    if "end_ns" in rec:
        return int(rec["end_ns"])
    if "ts_ns" not in rec:
        return None
    return int(rec["ts_ns"]) + int(rec.get("interval_ns", 0))


def read_recording(path: Path, watch: Watch = unwatched) -> tuple[list[Record], Iterator[Record]]:
    """(records that set the scene: the hello and snapshot before the first timed record;
    the rest, in the order they were sent or recorded, read as they are taken). `watch`:
    what is read goes through it (progress)."""
    kind = sniff(path)
    if kind in (TRACE, EVENTS):
        records = _analysed(path, watch)
    else:
        records = _ndjson_records(path, watch, printed=kind == PRINTED)
    scene: list[Record] = []
    for rec in records:
        if rec.get("type") not in SCENE_KINDS:
            return scene, _following(rec, records)
        scene.append(rec)
    return scene, _following(None, records)  # no timed record (stopped before its first)


def _following(first: Record | None, rest: Iterator[Record]) -> Iterator[Record]:
    """`first`, then the rest: a generator, which the replay closes when it is done."""
    if first is not None:
        yield first
    yield from rest


def _ndjson_records(
    path: Path, watch: Watch = unwatched, *, printed: bool = False
) -> Iterator[Record]:
    """A captured socket stream, the attribution log or `run --json`'s output (`printed`:
    its lines name no schema), through the log's reader: schema, torn last line and field
    types checked as for the daemon's own log, damaged lines skipped and noted."""
    from gpujitter.daemon.sinks.jsonlog import JsonLogReader, LinesClock
    from gpujitter.daemon.sinks.stream import STREAM_SCHEMA
    from gpujitter.daemon.sinks.trace import path_stat
    from gpujitter.probes.events import to_record

    st = path_stat(path)
    # The times the replay plays by: event kinds have theirs checked by their types, the
    # stream's own messages (hello, snapshot, daemon.status) and later versions' kinds not.
    if printed:
        records = JsonLogReader(path, schema=None, times=_TIMES)
    else:
        records = JsonLogReader(path, stream_schema=STREAM_SCHEMA, times=_TIMES)
    clock = LinesClock()  # a log's wall clock is its lines' `time` (a stream has a hello)
    # the reader does not say how far it is in the file: no position for the progress
    for rec in watch(records, lambda: None, st.st_size if st else 0):
        if rec["type"] != "hello":
            rec.pop("schema", None)  # the attribution log's per-line schema tag
            if (ref := clock.read(rec)) is not None:
                yield to_record(ref)
        yield rec
    for note in records.damage_notes():  # what the reading skipped (the status line says so)
        yield {"type": "replay.damage", "message": note}


def _analysed(path: Path, watch: Watch = unwatched) -> Iterator[Record]:
    """A trace's or an events file's events through the daemon's runtime, as live, a chunk
    at a time as the replay takes them."""
    from gpujitter.daemon.analysis.pipeline import AnalysisConfig
    from gpujitter.daemon.offline.recordings import open_recording
    from gpujitter.daemon.service.runtime import ListSource, Runtime
    from gpujitter.tui.feeds.streamed import StreamRecords

    recording = open_recording([path])
    header = recording.header
    yield {
        "type": "hello",
        "host": header.host,
        "kernel": header.kernel,
        "version": header.gpujitter,
        "clock": {"ts_ns": header.clock.ts_ns, "realtime_ns": header.clock.realtime_ns},
        "topology": header.topology.to_record(),
        "probes": list(header.probes),
    }
    out = StreamRecords()
    runtime = Runtime(
        ListSource(watch(recording, recording.position, recording.size), label=recording.what),
        header.topology, sinks=[out],
        analysis=lambda _: AnalysisConfig.from_record(header.analysis), signals=False,
    )  # fmt: skip
    yield runtime.state.snapshot(header.start_ns, runtime.state.status(header.start_ns))
    left_out = recording.traces.unreadable if recording.traces is not None else []
    for _, why in left_out:  # known before a record plays
        yield {"type": "replay.damage", "message": f"{why}; left out"}
    with runtime.stepped() as step:
        while step(CHUNK):
            yield from out.take()
    yield from out.take()  # what the pipeline still held
    for note in recording.damage:  # what the reading met (the status line says so)
        yield {"type": "replay.damage", "message": note}


def _timed(records: Iterator[Record]) -> Iterator[tuple[int, Record]]:
    """Each record with when it plays: its sending time, but never before its predecessor
    (the order stays the recording's: a record timed earlier, or not timed, plays with the
    one before it). Untimed records before the first timed one (a `dropped` notice) play
    with it: the recording starts at its first time, not at monotonic 0."""
    played_ns: int | None = None
    untimed: list[Record] = []
    with contextlib.closing(records):  # type: ignore[type-var]
        for rec in records:
            sent = emitted_at(rec)
            if played_ns is None:
                if sent is None:
                    untimed.append(rec)
                    continue
                played_ns = sent
                for early in untimed:
                    yield played_ns, early
                untimed.clear()
            played_ns = max(sent or 0, played_ns)
            yield played_ns, rec
    for rec in untimed:  # nothing in the recording is timed
        yield 0, rec


class ReplayFeed(Feed):
    """`at`: where to start ("start", "end" or monotonic ns); `playing`: start playing;
    `watch`: the first pass's reading goes through it (`gpujitter top`'s progress line)."""

    live = False

    def __init__(
        self,
        path: Path,
        *,
        at: str | int = "start",
        playing: bool = True,
        speed: float = 1.0,
        watch: Watch = unwatched,
    ) -> None:
        self.path = Path(path)
        self.label = f"replay {self.path.name}"
        kind = sniff(self.path)
        if kind in WHAT and kind != TRACE:
            self.label += f": {WHAT[kind]}"
        # One pass, reading as it goes, for what the seek bar and the jump to the next gap
        # need (where the recording starts and ends, how many gaps it holds); it also finds
        # bad input before the app starts.
        self.scene, rest = read_recording(self.path, watch)
        self.start_ns = self.end_ns = self.gaps = 0
        for n, (played_ns, rec) in enumerate(_timed(rest)):
            self.start_ns = played_ns if n == 0 else self.start_ns
            self.end_ns = played_ns
            self.gaps += rec.get("type") in GAP_KINDS
        if at == "start":
            self.at_ns = self.start_ns
        elif at == "end":
            self.at_ns = self.end_ns
        else:
            self.at_ns = int(at)
        self.playing = playing
        self.speed = speed
        self.replay = self
        self._rest: Iterator[tuple[int, Record]] = iter(())
        self._ahead: deque[tuple[int, Record]] = deque()  # read, not yet delivered
        self._gaps_delivered = 0
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
        try:
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
                    if self._next() is None:
                        self.playing = False
                last = now
                self._report(sink)
        finally:
            self._close()
        sink.connection("stopped")

    def _report(self, sink: Receiver, selected: str | None = None) -> None:
        pos = ReplayPosition(
            at_ns=self.at_ns,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            playing=self.playing,
            speed=self.speed,
            done=self._next() is None,
        )
        sink.position(pos, selected)

    def _close(self) -> None:
        """Let go of the reading (a trace's runtime closes its sinks)."""
        close = getattr(self._rest, "close", None)
        if close is not None:
            close()
        self._ahead.clear()

    def _restart(self, sink: Receiver) -> None:
        self._close()
        sink.reset()
        scene, rest = read_recording(self.path)
        sink.records(scene)
        self._rest = _timed(rest)
        self._gaps_delivered = 0

    def _next(self) -> tuple[int, Record] | None:
        """The next record to deliver (read ahead if need be), None at the end."""
        if not self._ahead:
            item = next(self._rest, None)
            if item is None:
                return None
            self._ahead.append(item)
        return self._ahead[0]

    def _deliver_while(self, sink: Receiver, more: Callable[[int, Record], bool]) -> None:
        batch: list[Record] = []
        while (item := self._next()) is not None and more(*item):
            self._ahead.popleft()
            batch.append(item[1])
            self._gaps_delivered += item[1].get("type") in GAP_KINDS
            if len(batch) == CHUNK:
                sink.records(batch)
                batch = []
        if batch:
            sink.records(batch)

    def _deliver_until(self, sink: Receiver, at_ns: int) -> None:
        at_ns = min(max(at_ns, self.start_ns), self.end_ns)
        self._deliver_while(sink, lambda played_ns, _: played_ns <= at_ns)
        self.at_ns = at_ns

    def _move(self, sink: Receiver, at_ns: int, *, playing: bool) -> None:
        if at_ns < self.at_ns:
            self._restart(sink)
        self._deliver_until(sink, at_ns)
        self.playing = playing and self._next() is not None
        self._report(sink)

    def _toggle(self, sink: Receiver) -> None:
        self.playing = not self.playing and self._next() is not None
        self._report(sink)

    def _set_speed(self, speed: float) -> None:
        self.speed = min(max(speed, SPEEDS[0]), SPEEDS[1])

    def _next_gap(self, sink: Receiver) -> None:
        """Play up to the next gap not yet shown (and its attribution), then pause there."""
        if self._gaps_delivered >= self.gaps:  # none left: stay where it is
            self.playing = False
            self._report(sink)
            return
        self._deliver_while(sink, lambda _, rec: rec.get("type") not in GAP_KINDS)
        item = self._next()
        if item is None:  # the recording changed since the first pass (rotated away)
            self.at_ns, self.playing = self.end_ns, False
            self._report(sink)
            return
        gap_ns, gap = item
        gap_id = f"{gap.get('gpu', 0)}:{gap.get('ts_ns', 0)}"
        # Its attribution, looked for among the records of the next ATTRIBUTION_WAIT_NS
        # (read ahead, not yet delivered: at most that stretch of the recording is held).
        while self._ahead[-1][0] <= gap_ns + ATTRIBUTION_WAIT_NS:
            following = next(self._rest, None)
            if following is None:
                break
            self._ahead.append(following)
        target = gap_ns
        for played_ns, other in itertools.islice(self._ahead, 1, None):
            if played_ns > gap_ns + ATTRIBUTION_WAIT_NS:
                break
            same = f"{other.get('gpu', 0)}:{other.get('ts_ns', 0)}" == gap_id
            if other.get("type") == "gpu.attribution" and same:
                target = played_ns
                break
        self._deliver_until(sink, target)
        self.playing = False
        self._report(sink, selected=gap_id)
