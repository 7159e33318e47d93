"""The daemon's attribution log: JSON lines, one record per line, each carrying its schema
("schema": "gpujitter.attribution/1"), so any line read alone (grep, tail, a rotated file)
says how to read it. docs/schema.md describes the records.

Each line goes to the file in one write() on an O_APPEND descriptor, so a crash can leave
only the last line incomplete; reopening the file cuts such a torn line off before writing
again. Rotation by size keeps name.1 (newest) .. name.N; `reopen()` (on SIGHUP) starts a
new file after logrotate has moved the old one away. Where renaming fails, lines go on into
the file open, and renaming is tried again a minute later; a log deleted under the daemon
(its folder removed) is opened again within a second, or its records counted as dropped.

A write the disk refuses (full, quota, I/O error) drops that record and counts it
(daemon/sinks/diskfull.py); every write tries again, and the first line that goes through after
such a stretch is a `log.dropped` record with the count, the reason and the time span.
"""

from __future__ import annotations

import calendar
import codecs
import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gpujitter.daemon.sinks.diskfull import WriteFailures, no_room, to_stderr
from gpujitter.daemon.sinks.rotation import Rotation, fsync_dir, say_once
from gpujitter.errors import GpujitterError
from gpujitter.files import open_regular
from gpujitter.probes.clock import stepped, wall_ns
from gpujitter.probes.events import (
    SCHEMA_MAJOR,
    BadRecord,
    ClockRef,
    Event,
    event_kinds,
    from_record,
    to_json,
)
from gpujitter.text import dumps, inert_json

LOG_SCHEMA = f"gpujitter.attribution/{SCHEMA_MAJOR}"
DROPPED = "log.dropped"  # the record that says how many records a failing disk cost
# Past any record the daemon writes (an attribution lists a bounded number of threads and
# evidence): a longer run without a newline is damage, not a torn last line.
MAX_LINE_BYTES = 1 << 20
_TAIL_CHUNK = 1 << 16
_GONE_CHECK_NS = 1_000_000_000  # how often a write asks whether the file was deleted
ROTATE_RETRY_NS = 60_000_000_000  # after a rotation that could not rename


_FALLOC_FL_KEEP_SIZE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def reserve(fd: int, offset: int, length: int) -> None:
    """Allocate the file's blocks for [offset, offset+length) without changing its size;
    OSError when the disk has no room. Where the file system cannot (EOPNOTSUPP), nothing
    is reserved and a full disk shows as a short write instead."""
    if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return
    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS):
        raise OSError(err, os.strerror(err))


IN_USE = "another gpujitter daemon writes it; give this one another log.path"
_LOCK_TRIES = 5  # a checker's shared lock is held for a moment: a few tries a few ms apart


def lock_exclusive(fd: int) -> bool:
    """Take the file's exclusive lock, held while `fd` is open; False when another open
    file holds a lock on it (another daemon's log, or for a moment a check of it). Where
    the file system has no such locks (NFS without a lock daemon), True: unguarded, as
    before locks were taken, rather than no log."""
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.002 * (attempt + 1))
        except OSError:
            return True
    return False


def in_use(path: Path) -> bool:
    """Whether a running daemon writes the log at `path` (holds its exclusive lock). Asked
    with a shared lock, which a descriptor open for reading may take on any file system,
    and which a writer's exclusive one refuses."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # none there, or not openable: opening it for writing will say
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # no locks here: no telling
    finally:
        os.close(fd)
    return False


def rotated_files(path: Path) -> list[Path]:
    """The log and its rotated files, oldest first: name.N .. name.1, name (if present)."""
    numbered = []
    k = 1
    # os.path.exists: False where a directory on the way may not be searched (Path.exists
    # raises there); opening the file then says why in one line.
    while os.path.exists(candidate := path.with_name(f"{path.name}.{k}")):
        numbered.append(candidate)
        k += 1
    current = [path] if os.path.exists(path) else []
    return [*reversed(numbered), *current]


class JsonLog:
    """Appends records as JSON lines to `path` (created with `mode`, whatever the umask).
    Safe to call from several threads. `repaired_bytes`: how much of a torn last line a
    previous crash left, cut off when the file was (re)opened. `failures`: the records the
    disk refused (`say` is told once when that starts and once when it ends)."""

    def __init__(
        self,
        path: str | Path,
        rotation: Rotation | None = None,
        *,
        schema: str = LOG_SCHEMA,
        mode: int = 0o640,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.rotation = rotation
        self.schema = schema
        # What every line starts with after its "{", made once: written with each record.
        self._lead = b'"schema":' + orjson.dumps(schema) + b","
        # ... and, whatever the schema's major, how every line of a log begins: a file that
        # does not is someone else's at a mistyped path (--log /etc/hosts).
        self._family = b'{"schema":' + orjson.dumps(schema.rsplit("/", 1)[0] + "/")[:-1]
        self.mode = mode
        # The wall clock's reference (LogSink keeps it current): each line then says when
        # its record began as `time`, RFC 3339 in UTC, which log shippers and people read;
        # None writes none (ts_ns alone is CLOCK_MONOTONIC).
        self.clock: ClockRef | None = None
        self.lines = 0
        self.repaired_bytes = 0
        self.failures = WriteFailures(f"log {self.path}", say or to_stderr)
        self._cannot_delete = say_once(self.failures.what, self.failures.say)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False
        self._rotate_after_ns = 0  # no rotation before (a failed one waits to retry)
        self._rotate_failing = False
        try:
            self._open()
        except GpujitterError as err:
            # A disk that is full now may have room later: start, and try at each write.
            # A place that cannot be written at all is a configuration error.
            if not no_room(err):
                raise
            self.failures.failed(err, time.monotonic_ns(), 0)

    def _open(self) -> None:
        # Read access too: a torn last line is found by reading the tail. Never through a
        # link at the log's own name: the daemon runs as root, and a link planted in its
        # folder would have it append to (and cut the tail of) any file on the system.
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = -1
        try:
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, self.mode)
                os.fchmod(fd, self.mode)
            except FileExistsError:
                fd = os.open(self.path, flags)
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device: no log
                raise GpujitterError(f"cannot open log {self.path}: not a regular file")
            # One writer a file: two daemons' lines (and rotations) would interleave.
            if not lock_exclusive(fd):
                raise GpujitterError(f"cannot open log {self.path}: {IN_USE}")
            self.size = self._cut_torn_line(fd)
        except OSError as err:
            if fd >= 0:
                os.close(fd)
            why = (
                "a symbolic link (give the file's own path)"
                if err.errno == errno.ELOOP
                else err.strerror
            )
            raise GpujitterError(f"cannot open log {self.path}: {why}") from None
        except GpujitterError:
            os.close(fd)
            raise
        self._fd = fd
        self._opened_ns = self._checked_ns = time.monotonic_ns()

    def _cut_torn_line(self, fd: int) -> int:
        """Truncate a last line without its newline (a crash mid-write); returns the size.
        Only what can be a torn record is cut. A file that does not begin as a log does, one
        whose end runs longer than a record without a newline, or one with no newline that
        does not begin as this schema's record, is someone else's file at a mistyped path:
        refused untouched."""
        size = os.fstat(fd).st_size
        if size == 0:
            return size
        head = os.pread(fd, len(self._family), 0)
        if not self._family.startswith(head):  # (shorter: a first line torn inside its lead)
            raise GpujitterError(
                f"cannot open log {self.path}: it does not begin with a gpujitter record: "
                "not a gpujitter log (left untouched)"
            )
        if os.pread(fd, 1, size - 1) == b"\n":
            return size
        floor = max(0, size - MAX_LINE_BYTES - 1)  # a torn line has its newline before it here
        keep = -1
        for pos in range(size, floor, -_TAIL_CHUNK):
            start = max(floor, pos - _TAIL_CHUNK)
            newline = os.pread(fd, pos - start, start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
        if keep < 0:
            # No newline at all: a torn first line only if it begins as every line does.
            lead = b"{" + self._lead
            if floor > 0 or not lead.startswith(os.pread(fd, len(lead), 0)):
                raise GpujitterError(
                    f"cannot open log {self.path}: its last {size - floor} bytes have no "
                    "newline and are no torn record: not a gpujitter log (left untouched)"
                )
            keep = 0
        os.ftruncate(fd, keep)
        self.repaired_bytes += size - keep
        return keep

    def write(self, record: Event | Mapping[str, Any]) -> bool:
        """Append one record (an event, or a plain mapping) as one line; False when the
        disk refused it (dropped and counted in `failures`)."""
        clock = self.clock  # one read: the runtime's thread may replace it meanwhile
        if isinstance(record, Event):
            raw = to_json(record, self._lead)
            if clock is not None:  # after the schema, which comes first on every line
                cut = 1 + len(self._lead)
                raw = raw[:cut] + b'"time":"' + rfc3339(clock, record.ts_ns) + b'",' + raw[cut:]
        else:
            raw = self._plain(record, clock)
        # inert_json: names in it are other processes' choice, and people `tail -f` a log.
        line = inert_json(raw) + b"\n"
        with self._lock:
            if self._closed:
                raise GpujitterError(f"log {self.path} written after close")
            now_ns = time.monotonic_ns()
            try:
                if self._fd is not None and now_ns - self._checked_ns >= _GONE_CHECK_NS:
                    self._reopen_if_gone(now_ns)
                if self._fd is None:
                    self._open()  # it failed after a rotation or a reopen: try again
                # The episode's count goes with the record, as one write: alone, the short
                # marker fit where the record did not, writing was said to work again, and
                # the drops that followed went unsaid within the minute's note.
                failing = self.failures.failing
                lines = self._dropped_line(now_ns, clock) + line if failing else line
                if self._rotation_due(now_ns, len(lines)):
                    self._rotate(now_ns)
                self._append(lines)
                self.failures.recovered()
            except GpujitterError as err:
                self.failures.failed(err, now_ns)
                return False
            return True

    def _plain(self, record: Mapping[str, Any], clock: ClockRef | None) -> bytes:
        """A record that is no event as a line's JSON, its schema and time first."""
        ts_ns = record.get("ts_ns")
        wall = {"time": rfc3339(clock, ts_ns).decode()} if clock and type(ts_ns) is int else {}
        return dumps({"schema": self.schema, **wall, **record})

    def _dropped_line(self, now_ns: int, clock: ClockRef | None) -> bytes:
        f = self.failures
        rec = {"type": DROPPED, "ts_ns": now_ns, "count": f.dropped, "since_ns": f.since_ns,
               "reason": f.reason}  # fmt: skip
        return self._plain(rec, clock) + b"\n"

    def _append(self, line: bytes) -> None:
        assert self._fd is not None
        try:
            # Room first: a write into reserved blocks cannot stop halfway, so a reader
            # following the file (a log shipper) never sees a fragment that is cut off later.
            reserve(self._fd, self.size, len(line))
            written = os.write(self._fd, line)
        except OSError as err:
            raise GpujitterError(f"cannot write log {self.path}: {err.strerror}") from None
        if written != len(line):
            # Disk full mid-line: take the fragment back so no broken line stays behind.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.size)
            raise GpujitterError(f"cannot write log {self.path}: short write (disk full?)")
        self.size += written
        self.lines += line.count(b"\n")

    def _rotation_due(self, now_ns: int, length: int) -> bool:
        if not self.rotation or not self.size or now_ns < self._rotate_after_ns:
            return False
        return self.rotation.due(self.size + length, now_ns - self._opened_ns)

    def _reopen_if_gone(self, now_ns: int) -> None:
        """Open the path again when the file open was deleted (its folder removed, `rm` of
        the log): lines written into an unlinked file are lost without an error."""
        assert self._fd is not None
        self._checked_ns = now_ns
        if os.fstat(self._fd).st_nlink > 0:
            return
        os.close(self._fd)
        self._fd = None
        self.failures.say(f"{self.failures.what}: the file was deleted; opening it again")

    def _rotate(self, now_ns: int) -> None:
        """Start a new file. Where renaming fails (a folder made read-only), the lines go on
        into the file open, past max_bytes, and renaming is tried again a while later:
        records are not dropped while they can be written."""
        assert self._fd is not None and self.rotation is not None
        try:
            # Oldest first, so no rename overwrites; the file open is renamed last, and
            # stays open until then: where renaming stops, lines go on into it.
            for older in rotated_files(self.path):
                suffix = older.name[len(self.path.name) :]
                k = int(suffix[1:]) if suffix else 0
                older.rename(self.path.with_name(f"{self.path.name}.{k + 1}"))
        except OSError as err:
            self._rotate_after_ns = now_ns + ROTATE_RETRY_NS
            if not self._rotate_failing:
                self._rotate_failing = True
                self.failures.say(
                    f"cannot rotate log {self.path}: {err.strerror}; writing on past "
                    f"max_bytes, trying again every {ROTATE_RETRY_NS // 1_000_000_000} s"
                )
            return
        os.close(self._fd)
        self._fd = None
        self._open()
        with contextlib.suppress(OSError):  # the renames' durability, not the lines'
            fsync_dir(self.path.parent)
        if self._rotate_failing:
            self._rotate_failing = False
            self.failures.say(f"{self.failures.what}: rotated again")
        self.rotation.prune(rotated_files(self.path), self._cannot_delete)

    def reopen(self) -> None:
        """Close and open the path again: after logrotate renamed the file (SIGHUP), new
        lines go to a new file at the configured name (or, if it cannot be opened now, at
        the next write that can)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            try:
                self._open()
            except GpujitterError as err:  # said now; the next write that can opens it
                self.failures.failed(err, time.monotonic_ns(), 0)

    def close(self) -> None:
        """fsync and close; the log is then durable up to its last line. What a failing
        disk still holds back is said, not raised: the records are already counted."""
        with self._lock:
            self._closed = True
            if self._fd is None:
                return
            try:
                os.fsync(self._fd)
            except OSError as err:
                self.failures.say(f"{self.failures.what}: fsync at close: {err.strerror}")
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> JsonLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JsonLogReader:
    """Reads JSON lines that name their schema: the attribution log (and its rotated files,
    oldest first, with `rotated=True`), each line naming it; or, given `stream_schema`, also
    a captured socket stream, whose first line (the hello) names it for the lines after it;
    or, with `schema=None`, lines that name none (`gpujitter run --json`'s).
    A torn last line of a file (no newline and no whole JSON, at most MAX_LINE_BYTES) is
    skipped and counted in `torn_bytes`. A damaged line elsewhere (no JSON, JSON that is no
    object, a longer run without a newline, a record whose type is no string, a record of
    an event kind with a field of the wrong type, a field named in `times` that is no int)
    is skipped and counted, as a trace's damaged records are: one bad line does not cost
    the records after it; damage_notes() names it. A record of another schema raises
    GpujitterError with one line: that is another file, not damage."""

    def __init__(
        self,
        path: str | Path,
        *,
        rotated: bool = False,
        schema: str | None = LOG_SCHEMA,
        stream_schema: str | None = None,
        times: tuple[str, ...] = (),
    ):
        self.path = Path(path)
        self.files = rotated_files(self.path) if rotated else [self.path]
        self.schema = schema
        self.stream_schema = stream_schema
        self.times = times  # fields any record holds as ints where it has them
        self.damaged: dict[Path, LineDamage] = {}  # the files with damage, by the last read

    @property
    def torn_bytes(self) -> int:
        return sum(d.torn for d in self.damaged.values())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.damaged = {}
        for path in self.files:
            yield from self._read(path)

    def damage_notes(self) -> list[str]:
        """What the last iteration skipped, one line a file and kind of damage."""
        return [note for path, d in self.damaged.items() for note in d.notes(path)]

    def _read(self, path: Path) -> Iterator[dict[str, Any]]:
        # a rotated file is opened by its name alone: a FIFO by that name would block
        f = open_regular(path, "cannot open log")
        schema, named_once, first = self.schema, False, True  # first: no record read yet
        damaged = self.damaged.setdefault(path, LineDamage())
        with f:
            for lineno, line in numbered_lines(f, damaged):
                if not line.strip():  # no record (a file edited by hand): as an events file's
                    continue
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    if not line.endswith(b"\n"):  # a writer stopped mid-line
                        damaged.tear(line)
                        break
                    damaged.add(lineno, "not a JSON line", len(line), line.count(b"\0"))
                    continue
                # (a last line without its newline that is whole JSON is a record: no prefix
                # of an object's text is an object)
                if not isinstance(rec, dict):
                    damaged.add(lineno, "not a JSON object", len(line))
                    continue
                if first and self.stream_schema and _names(rec, self.stream_schema):
                    schema, named_once = self.stream_schema, True
                first = False
                if schema is not None and not (named_once and "schema" not in rec):
                    _check_schema(f"{path}:{lineno}", rec, schema)
                kind = rec.get("type")
                if not isinstance(kind, str):  # what every reader of records keys on
                    damaged.add(lineno, "record type is not a string", len(line))
                    continue
                if bad := next((k for k in self.times if type(rec.get(k, 0)) is not int), None):
                    damaged.add(lineno, f"bad {kind[:40]} record: {bad}: want int, "
                                        f"got {type(rec[bad]).__name__}", len(line))  # fmt: skip
                    continue
                if kind in event_kinds():
                    try:
                        from_record(rec)
                    except BadRecord as err:
                        damaged.add(lineno, str(err), len(line))
                        continue
                yield rec
        if not (damaged.count or damaged.torn):
            del self.damaged[path]


def rfc3339(clock: ClockRef, mono_ns: int) -> bytes:
    """A monotonic time as the wall clock's, in UTC to the microsecond:
    2026-12-07T12:01:07.250123Z."""
    seconds, ns = divmod(wall_ns(clock, mono_ns), 1_000_000_000)
    return time.strftime(f"%Y-%m-%dT%H:%M:%S.{ns // 1000:06d}Z", time.gmtime(seconds)).encode()


def rfc3339_ns(text: object) -> int | None:
    """A line's `time` (rfc3339's form) as ns since the epoch; None for anything else (a
    file from elsewhere, a line written before lines had one)."""
    if not isinstance(text, str) or len(text) != 27:
        return None
    try:
        when = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return None
    return calendar.timegm(when.timetuple()) * 1_000_000_000 + when.microsecond * 1000


class LinesClock:
    """The wall clock a log's lines give (it keeps no reference itself): each line's `time`
    against its `ts_ns`, taken at the first line that has one and again where a line's says
    the clock was set."""

    __slots__ = ("ref",)

    def __init__(self) -> None:
        self.ref: ClockRef | None = None

    def read(self, rec: Mapping[str, Any]) -> ClockRef | None:
        """The line's reference where it is a new one, else None."""
        wall, ts_ns = rfc3339_ns(rec.get("time")), rec.get("ts_ns")
        if not wall or type(ts_ns) is not int:
            return None
        ref = ClockRef(ts_ns=ts_ns, realtime_ns=wall)
        if self.ref is not None and not stepped(self.ref, ref):
            return None
        self.ref = ref
        return ref


def numbered_lines(f: BinaryIO, damaged: LineDamage) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSON-lines file, at most MAX_LINE_BYTES each. A run longer
    than that without a newline is no last line cut short but damage: it is read through
    to its newline and counted in `damaged`. The last line may lack its newline (a writer
    stopped mid-line): the caller judges it. A UTF-8 byte-order mark before the first line
    (an editor's on some systems, which JSON lines do not have) is no part of it."""
    n = 0
    while line := f.readline(MAX_LINE_BYTES + 1):
        n += 1
        if n == 1:
            line = line.removeprefix(codecs.BOM_UTF8)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            size, zeros = len(line), line.count(b"\0")
            while (more := f.readline(MAX_LINE_BYTES)) and not more.endswith(b"\n"):
                size, zeros = size + len(more), zeros + more.count(b"\0")
            damaged.add(
                n, f"over {MAX_LINE_BYTES} bytes without a newline, longer than any record",
                size + len(more), zeros + more.count(b"\0"),
            )  # fmt: skip
        else:
            yield n, line


# What zero bytes in a JSON-lines file are (no writer of JSON lines writes one).
ZEROS_LOST = (
    "a crash's block that never reached the disk: the records it overwrote are lost, how many "
    "is not known"
)


class LineDamage:
    """The damaged lines of one JSON-lines file, skipped: how many, their bytes and zero
    bytes, and the first; and the bytes of its torn last line (a writer stopped mid-line),
    which is no damage, and the zeros among them. A line counts what its newlines bound, and
    a crash's block of zeros holds none: the lines it overwrote read as one, so the note says
    the bytes lost too (at the file's end too, where they read as a torn last line)."""

    __slots__ = ("bytes", "count", "first", "torn", "torn_zeros", "zeros")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.zeros = 0
        self.first = ""
        self.torn = 0
        self.torn_zeros = 0

    def tear(self, line: bytes) -> None:
        """The file's last line, cut short (no newline, no whole JSON)."""
        self.torn = len(line)
        self.torn_zeros = line.count(b"\0")

    def add(self, lineno: int, why: str, size: int, zeros: int = 0) -> None:
        """A damaged line: its number, why, its bytes (its newline included) and how many
        of them are zero bytes (no writer of JSON lines writes one)."""
        self.count += 1
        self.bytes += size
        self.zeros += zeros
        if not self.first:
            self.first = f"line {lineno}, {why}"

    def notes(self, path: Path) -> list[str]:
        notes = []
        if self.count:
            zeros = f", {self.zeros} of them zeros ({ZEROS_LOST})" if self.zeros else ""
            notes.append(
                f"{path}: {self.count} damaged line(s) skipped, the first: {self.first}; "
                f"{self.bytes} bytes in all{zeros}; the file is damaged"
            )
        if self.torn:
            zeros = f", {self.torn_zeros} of them zeros ({ZEROS_LOST})" if self.torn_zeros else ""
            notes.append(f"{path}: torn last line ({self.torn} bytes){zeros}")
        return notes


def _names(rec: Any, schema: str) -> bool:
    """Whether the record is an object that names `schema`, in any major."""
    got = rec.get("schema") if isinstance(rec, dict) else None
    return isinstance(got, str) and got.startswith(schema.rsplit("/", 1)[0] + "/")


def _check_schema(where: str, rec: Any, schema: str) -> None:
    if not _names(rec, schema):
        raise GpujitterError(f"{where}: not a {schema.rsplit('/', 1)[0]}/N record")
    if rec["schema"] != schema:
        raise GpujitterError(
            f"{where}: record of schema {rec['schema']}; this gpujitter reads {schema}"
        )
