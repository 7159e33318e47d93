"""What an offline command reads: any recording gpujitter writes, told apart by its content,
never its name, and read as one stream of typed events.

- a trace (`gpujitter record`, `run --record`), or a directory of rotated trace files;
- an events file (`gaps --save-events`): NDJSON events, the first a meta.clock;
- an attribution log (`run --log`, its rotated files): attributions already made;
- `gpujitter run --json`'s output: the same attributions, as printed (the log's lines less
  their schema).

`report`, `trace`, `export` and `gaps --replay-events` open their inputs here, so each reads
every format or refuses it in one line; a log is shown as it was logged (not re-analysed),
and every command says what it is reading when it is not a trace.
"""

from __future__ import annotations

import codecs
import dataclasses
import itertools
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.sinks.jsonlog import (
    DROPPED,
    LOG_SCHEMA,
    MAX_LINE_BYTES,
    JsonLogReader,
    LineDamage,
    LinesClock,
    numbered_lines,
    rotated_files,
)
from gpujitter.daemon.sinks.trace import (
    MAGIC,
    SUFFIX,
    TraceHeader,
    TraceSet,
    path_stat,
    trace_paths,
)
from gpujitter.errors import GpujitterError
from gpujitter.files import open_regular
from gpujitter.probes.clock import Clocks, format_wall, wall_ns
from gpujitter.probes.events import (
    BadRecord,
    ClockRef,
    Event,
    end_of,
    event_kinds,
    from_record,
)
from gpujitter.probes.topology import Topology

TRACE, EVENTS, LOG, PRINTED, STREAM = "trace", "events", "log", "printed", "stream"
# A captured socket stream (its first line the hello naming it): only `top --replay` plays it.
STREAM_PREFIX = "gpujitter.stream/"
WHAT = {
    TRACE: "a trace",
    EVENTS: "an events file (gaps --save-events)",
    LOG: "an attribution log (attributions as logged, not re-analysed)",
    PRINTED: "attributions as `gpujitter run --json` printed them (not re-analysed)",
}
FORMATS = (
    "a trace, a directory of them, an events file (gaps --save-events), an attribution log "
    "or the output of run --json"
)


def _known_kind(kind: object) -> bool:
    """An event kind this version reads (a record's "type" can be any JSON value)."""
    return isinstance(kind, str) and kind in event_kinds()


# Blank lines before a JSON-lines file's first record that sniff reads past (its readers
# skip blank lines: a file edited by hand or joined with others).
BLANK_LINES_SKIPPED = 1000
# Lines that say nothing of their file (damaged: no JSON, no known kind) that sniff reads
# past to the first that does: the readers skip and count them as damage, and one damaged
# first line refused the whole recording after it.
UNTOLD_LINES_SKIPPED = 16


def sniff(path: Path) -> str:
    """Which kind of recording a path holds (a directory: rotated traces), told by its magic
    or by its first record that tells. Only a regular file or a directory: a FIFO would
    block the open, and a pipe's first bytes, read here, would be gone for the reader that
    follows."""
    st = path_stat(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return TRACE
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise GpujitterError(f"{path}: not a regular file (save a stream to a file first)")
    blank = untold = 0
    try:
        with open_regular(path, "cannot read") as f:  # it may have changed since the stat
            head = f.read(len(MAGIC))
            if head == MAGIC:
                return TRACE
            f.seek(0)  # (the magic's bytes may hold more than one short line)
            # (a byte-order mark before the first line is no part of it: numbered_lines)
            line = f.readline(MAX_LINE_BYTES).removeprefix(codecs.BOM_UTF8)
            while line and blank < BLANK_LINES_SKIPPED and untold < UNTOLD_LINES_SKIPPED:
                if not line.strip():
                    blank += 1
                elif (kind := _told(line)) is not None:
                    return kind
                else:
                    untold += 1
                line = f.readline(MAX_LINE_BYTES)
    except OSError as err:
        raise GpujitterError(f"cannot read {path}: {err.strerror}") from None
    if not untold and not line:
        # A daemon's log stays empty until its first attribution, and is so again right after
        # a rotation: its rotated files hold what it recorded.
        if len(rotated_files(path)) > 1:
            return LOG
        raise GpujitterError(f"{path}: empty, nothing recorded in it ({FORMATS})")
    raise GpujitterError(f"{path}: not a gpujitter recording ({FORMATS})")


def _told(line: bytes) -> str | None:
    """The kind of recording a JSON line says its file is (None: it says nothing)."""
    try:
        first = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(first, dict):
        return None
    schema = first.get("schema")
    if isinstance(schema, str) and schema.startswith(LOG_SCHEMA.rsplit("/", 1)[0] + "/"):
        return LOG
    if isinstance(schema, str) and schema.startswith(STREAM_PREFIX):
        return STREAM
    if "schema" not in first and _known_kind(first.get("type")):
        # an events file begins with its wall clock, never with an attribution
        return PRINTED if first["type"] == Attribution.KIND else EVENTS
    return None


@dataclass(slots=True)
class Recording:
    """One recording, whatever its format. header: a trace's own; for the other kinds one
    made of what they hold (the wall clock of an events file's meta.clock; host, kernel and
    topology unknown). damage: notes gathered while reading (torn tails, skipped kinds,
    damaged lines); corrupt: an events file's or a log's damaged lines, skipped (a trace's
    damage is its TraceSet's)."""

    kind: str
    paths: list[Path]
    header: TraceHeader
    damage: list[str] = field(default_factory=list)
    corrupt: int = 0
    _traces: TraceSet | None = None
    _read: int = 0  # bytes of the events files read so far
    # the wall-clock references read that began a later boot (_restarted), for clocks()
    _restarts: set[ClockRef] = field(default_factory=set)
    # a log's or run --json capture's first attribution -> its file (_first_attributions)
    _firsts: dict[tuple[int, int, int], Path] = field(default_factory=dict)

    @property
    def files(self) -> list[Path]:
        """Every file reading it opens: those named, and a log's rotated files where one log
        is named (what an output must never be written over)."""
        return _files_read(self.kind, self.paths)

    @property
    def size(self) -> int:
        """Bytes of the files named (for progress: a log's rotated files are not named)."""
        return sum(st.st_size for p in self.paths if (st := path_stat(p)) is not None)

    def position(self) -> int | None:
        """Bytes read so far, for progress; None for a log (its rotated files are read
        too, and it is not replayed: read quickly)."""
        if self._traces is not None:
            return self._traces.position()
        if self.kind != EVENTS:
            return None
        return self._read

    @property
    def analysed(self) -> bool:
        """Its attributions were made when it was written (a log, run --json's output): not
        replayed again."""
        return self.kind in (LOG, PRINTED)

    @property
    def wall_clock(self) -> bool:
        """Whether its times can be read as wall time (a log whose lines carry no `time`, as
        before they did, has no clock)."""
        return self.header.clock.realtime_ns != 0

    @property
    def what(self) -> str:
        return WHAT[self.kind]

    @property
    def traces(self) -> TraceSet | None:
        """A trace recording's files (those left out too, `unreadable`); None for others."""
        return self._traces

    def clocks(self) -> Clocks:
        """Its wall clock's references, to be given those its reading meets (as a meta.clock
        event): each said where it moves the times shown, a trace file's header by its file,
        and a later boot's as the node's restart."""
        began = self._traces.began if self._traces is not None else {}
        return Clocks(self.header.clock, began=began, restarts=self._restarts)

    def __iter__(self) -> Iterator[Event]:
        """Its events, the wall clock's references among them; a reference that began a later
        boot is kept in `_restarts` before it is given: where each trace file names its boot,
        a file's of another boot; else one its times tell (_restarted)."""
        self._restarts.clear()
        told = self._traces is not None and self._traces.boot_known
        clock, last_ns = self.header.clock, 0  # the latest reference, the latest record's time
        for ev in self._read_all():
            if type(ev) is ClockRef:
                if (
                    ev in self._traces.rebooted
                    if told and self._traces is not None
                    else _restarted(clock, ev, last_ns)
                ):
                    self._restarts.add(ev)
                    last_ns = 0  # the boot's records, for the next restart
                clock = ev
            elif ev.ts_ns > last_ns:
                last_ns = ev.ts_ns
            yield ev

    def boots(self) -> Iterator[Boot]:
        """Its boots of the node, oldest first, each to be read to its end before the next is
        given: a trace's files by the boot their header names, and within those (files of no
        boot id, a log's or an events file's lines) at each restart their times tell
        (_restarted). A single boot's events are those the recording gives. Afterwards
        `damage` is every boot's."""
        parts = [self]
        if self._traces is not None and len(sets := self._traces.boots()) > 1:
            parts = [Recording(TRACE, t.paths, t.headers[0], _traces=t) for t in sets]
        boots: list[Boot] = []
        before = 0  # bytes of the parts read before
        for part in parts:
            events = iter(part)
            clock: ClockRef | None = part.header.clock
            while clock is not None:
                boot = Boot(part, clock, len(boots) + 1, events, before, boots)
                boots.append(boot)
                yield boot
                for _ in boot:  # what its reader left unread
                    pass
                clock = boot.next_clock
            before += part.size
        if parts[0] is not self:
            self.damage = [note for part in parts for note in part.damage]

    def _read_all(self) -> Iterator[Event]:
        if self._traces is not None:
            yield from self._traces
            self.damage = list(self._traces.damage)
            return
        # One log named: it and its rotated files, oldest first; several: each as named.
        rotated = len(self.paths) == 1
        self._read, self.damage, self.corrupt = 0, [], 0
        met: dict[tuple[int, int, int], Path] = {}  # a file's first attribution -> read in
        for path in self.paths:
            if self.kind == EVENTS:
                yield from _events(path, self)
                continue
            for ev in _logged(path, self, rotated and self.kind == LOG, self.kind):
                # A gap is attributed once: a file's first attribution met twice means one
                # file holds another's lines from its start on, or its own twice.
                if type(ev) is Attribution and (key := _key(ev)) in self._firsts:
                    if key in met:
                        raise GpujitterError(_repeated(met[key], path))
                    met[key] = path
                yield ev


class Boot:
    """One boot of the node in a recording: its events, read through their own pipeline and
    shown by its own clock. `number` of `of` (`of` is known once every boot is read: boots()
    is a stream); `boot_id` its trace header's ("" in other recordings and older traces);
    `first_ns`, `last_ns`: the span of its records' times, once read."""

    def __init__(
        self,
        rec: Recording,
        clock: ClockRef,
        number: int,
        events: Iterator[Event],
        before: int,
        boots: list[Boot],
    ) -> None:
        self.rec = rec
        self.clock = clock  # its first wall-clock reference
        self.number = number
        self.header = rec.header if number == 1 or clock == rec.header.clock else (
            dataclasses.replace(rec.header, clock=clock, start_ns=clock.ts_ns)
        )  # fmt: skip
        self.boot_id = rec.header.boot_id if clock == rec.header.clock else ""
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.next_clock: ClockRef | None = None  # the reference that began the next boot
        self._events = events
        self._before = before
        self._boots = boots
        self._started = number > 1 and clock != rec.header.clock  # its first event: `clock`
        self._done = False

    @property
    def of(self) -> int:
        return len(self._boots)

    def clocks(self) -> Clocks:
        """Its wall clock's references, as Recording.clocks() gives a recording's."""
        began = self.rec._traces.began if self.rec._traces is not None else {}
        return Clocks(self.clock, began=began)

    def line(self, clocks: Clocks) -> str:
        """What introduces it, once read, by its clock: `boot 2 of 2: 3f9c2a7d, 2026-12-01
        12:14:03.000000 +0000 to 12:40:00.000000`."""
        which = self.boot_id[:8] or (
            "no boot id (a restart told by its times)" if self.number > 1 else "no boot id"
        )
        first, last = self.first_ns, self.last_ns
        if first is None or last is None:
            return f"boot {self.number} of {self.of}: {which}, no records"
        return (
            f"boot {self.number} of {self.of}: {which}, "
            f"{format_wall(clocks.at(first), first, date=True)} to "
            f"{format_wall(clocks.at(last), last)}"
        )

    def position(self) -> int | None:
        """Bytes read so far, of the whole recording (for progress)."""
        at = self.rec.position()
        return None if at is None else self._before + at

    def __iter__(self) -> Iterator[Event]:
        """Its events, once: the stream goes on to the next boot's."""
        if self._done:
            return
        if self._started:  # the reference that began it, met at the end of the boot before
            self._started = False
            yield self.clock
        for ev in self._events:
            if type(ev) is ClockRef and ev in self.rec._restarts:
                self.next_clock, self._done = ev, True
                return
            t = ev.ts_ns
            self.first_ns = t if self.first_ns is None else min(self.first_ns, t)
            self.last_ns = t if self.last_ns is None else max(self.last_ns, t)
            yield ev
        self._done = True


def _restarted(clock: ClockRef, ref: ClockRef, last_ns: int) -> bool:
    """Whether a wall-clock reference is of a later boot than the records read before it:
    its monotonic time is behind theirs by more than a record's time may leap (the node's
    monotonic clock began again; one of its boot is never behind them by so much), and by its
    own clock its boot came after the latest of them (two recordings of one boot that
    overlap share its start, give or take a clock set)."""
    return (
        clock.realtime_ns != 0
        and ref.ts_ns < last_ns - LEAP_NS
        and ref.realtime_ns - ref.ts_ns > wall_ns(clock, last_ns)
    )


def _files_read(kind: str, paths: list[Path]) -> list[Path]:
    """The files a recording's reading opens, oldest first: one log named is it and its
    rotated files; anything else, the files named."""
    if kind == LOG and len(paths) == 1:
        return rotated_files(paths[0]) or paths
    return paths


def _kind(path: Path, files: int) -> str:
    """sniff(), but a trace file of several that cannot be read as one (its start damaged,
    a dangling link, a directory) is a trace: TraceSet leaves it out, said so, and reads
    the others."""
    try:
        return sniff(path)
    except GpujitterError:
        if files > 1 and path.name.endswith(SUFFIX):
            return TRACE
        raise


def open_recording(args: Sequence[str | Path]) -> Recording:
    """The recordings a user named (files, directories, glob patterns), all of one kind."""
    paths = trace_paths(args)
    kinds = {_kind(p, len(paths)) for p in paths}
    if len(kinds) > 1:
        raise GpujitterError(f"mixed recordings ({', '.join(sorted(kinds))}): give one kind")
    (kind,) = kinds
    if kind == STREAM:
        raise GpujitterError(
            f"{paths[0]}: a captured socket stream: play it with gpujitter top --replay"
        )
    if kind == TRACE:
        traces = TraceSet(args)  # (a directory's entry that is no trace: left out, said)
        return Recording(TRACE, traces.paths, traces.headers[0], _traces=traces)
    firsts = _first_attributions(paths, kind) if kind in (LOG, PRINTED) else {}
    return Recording(kind, paths, _made_header(paths, kind), _firsts=firsts)


def _key(attr: Attribution) -> tuple[int, int, int]:
    return attr.gpu, attr.ts_ns, attr.end_ns


def _first_attributions(paths: list[Path], kind: str) -> dict[tuple[int, int, int], Path]:
    """Each file's first attribution, for the reading to tell a file that repeats another's
    (or its own) lines: read together, every gap, idle time and share would count twice. A
    trace's copy is refused by its header; a log has none, but a gap is attributed once.
    Two files that begin with the same attribution are refused here, before any reading
    (each file's first alone: no memory kept per line)."""
    firsts: dict[tuple[int, int, int], Path] = {}
    for path in paths:
        first = next(
            (ev for ev in _logged(path, None, False, kind) if isinstance(ev, Attribution)), None
        )
        if first is None:
            continue
        if (key := _key(first)) in firsts:
            raise GpujitterError(
                f"{firsts[key]} and {path} begin with the same attribution (one is a copy of "
                "the other, or both a capture of one run): read one of them"
            )
        firsts[key] = path
    return firsts


def _repeated(before: Path, path: Path) -> str:
    """Why a recording is refused whose file `path` holds again an attribution read in
    `before`."""
    if before == path:
        return f"{path} holds its attributions twice (a file joined with its copy): read it once"
    return (
        f"{path} and {before} hold the same attributions (one a copy of a part of the other, "
        "or logs that overlap): read each attribution once"
    )


# How far a header made for a log looks for its wall clock: a log an older version began
# has lines without `time` before the first with one.
CLOCK_LOOKS = 10_000


def _made_header(paths: list[Path], kind: str) -> TraceHeader:
    """Its start is the first record's, of the oldest file read (one log named: its rotated
    files first); its clock the first its records give."""
    clock = ClockRef(ts_ns=0, realtime_ns=0)
    start_ns: int | None = None
    read = (
        _events(p, None) if kind == EVENTS else _logged(p, None, False, kind)
        for p in _files_read(kind, paths)
    )
    for ev in itertools.islice(itertools.chain.from_iterable(read), CLOCK_LOOKS):
        if start_ns is None:
            start_ns = ev.ts_ns
        if isinstance(ev, ClockRef):
            clock = ev
            break
    return TraceHeader(
        host="?",
        kernel="?",
        topology=Topology(cpu_node={}),
        clock=clock,
        start_ns=start_ns or 0,
        probes=(),
        thresholds={},
    )


def _events(path: Path, into: Recording | None) -> Iterator[Event]:
    """An events file's events; a line of an unknown kind is skipped and noted (a newer
    writer), and so is a damaged one (the events after it are read), a time that leaps
    away and back included (_leaps_skipped)."""
    damaged = LineDamage()
    yield from _leaps_skipped(_numbered_events(path, into, damaged), damaged)
    if into is not None:
        into.corrupt += damaged.count
        into.damage += damaged.notes(path)


# An events file is written as the events come: each record's time is close to the latest
# before it (off-CPU intervals are written at their end, which is that time). One past all
# of those by more than this, with the next record back before it by as much, is a damaged
# time, not a pause (the records after a pause share its time): one event an hour ahead
# moved the engine's clock an hour on, and it took every later event for one too late.
LEAP_NS = 60_000_000_000


def _leaps_skipped(read: Iterator[tuple[int, int, Event]], damaged: LineDamage) -> Iterator[Event]:
    """The events less those whose time leaps LEAP_NS past every one before them and the
    one after them (each a damaged line): a leap is held until the next event says which."""
    clock = -1  # the latest time of the events let through
    held: tuple[int, int, Event, int] | None = None  # a leap: its line, size, event and time
    for n, size, ev in read:
        t = end_of(ev)
        if held is not None:
            line, leap_size, leap, leap_t = held
            held = None
            if t < leap_t - LEAP_NS:
                ahead = (leap_t - clock) / 1e9
                damaged.add(line, f"its time is {ahead:.0f} s past the events around it", leap_size)
            else:
                clock = leap_t
                yield leap
        if clock >= 0 and t > clock + LEAP_NS:
            held = (n, size, ev, t)
            continue
        clock = max(clock, t)
        yield ev
    if held is not None:  # nothing after it to say otherwise
        yield held[2]


def _numbered_events(
    path: Path, into: Recording | None, damaged: LineDamage
) -> Iterator[tuple[int, int, Event]]:
    """(line number, its bytes, event) of an events file's records."""
    skipped = 0
    before = into._read if into is not None else 0  # the files named ahead of this one
    with open_regular(path, "cannot read") as f:
        for n, line in numbered_lines(f, damaged):
            if into is not None:  # the file's offset: an over-long damaged run counts too
                into._read = before + f.tell()
            if not line.strip():
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                if not line.endswith(b"\n"):  # a torn last line: the writer was stopped
                    damaged.tear(line)
                    break
                damaged.add(n, "not a JSON line", len(line), line.count(b"\0"))
                continue
            # a kind a newer writer added is noted; no kind, or one that is no name, is damage
            kind = rec.get("type") if isinstance(rec, dict) else None
            if isinstance(kind, str) and not _known_kind(kind):
                skipped += 1
                continue
            try:
                ev = from_record(rec)
            except BadRecord as err:
                damaged.add(n, str(err), len(line))
                continue
            yield n, len(line), ev
    if into is not None and skipped:
        into.damage.append(f"{path}: {skipped} records of kinds this version does not know")


def _logged(path: Path, into: Recording | None, rotated: bool, kind: str) -> Iterator[Event]:
    """An attribution log's records as events (with its rotated files, oldest first), or
    run --json's (`kind` PRINTED: its lines name no schema), and the wall clock their lines'
    `time` give, as a meta.clock before the first such line and before each line whose time
    says the clock was set (neither keeps a reference itself)."""
    reader = JsonLogReader(path, rotated=rotated, schema=LOG_SCHEMA if kind == LOG else None)
    rec: dict[str, Any]
    clock = LinesClock()
    dropped = skipped = 0
    for rec in reader:
        if _known_kind(rec.get("type")):
            ev = from_record({k: v for k, v in rec.items() if k not in ("schema", "time")})
            if (ref := clock.read(rec)) is not None:
                yield ref
            yield ev
        elif rec["type"] == DROPPED:  # what the disk refused: said, as nothing else holds it
            count = rec.get("count")
            dropped += count if type(count) is int and count > 0 else 0
        else:
            skipped += 1
    if into is not None:
        into.corrupt += sum(d.count for d in reader.damaged.values())
        into.damage += reader.damage_notes()
        if dropped:
            into.damage.append(
                f"{path}: {dropped} attributions the daemon could not write (log.dropped: "
                "the disk refused them); they are not in this report"
            )
        if skipped:
            into.damage.append(f"{path}: {skipped} records of kinds this version does not know")
