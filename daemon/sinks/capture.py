"""Capturing the raw event stream: a capture that writes the events a runtime takes
(daemon/service/runtime.py) into one trace file or a rotating directory of them (`gpujitter record
-o`, the daemon's `--record`).

When the disk refuses a write the capture keeps going (daemon/sinks/diskfull.py): the frames of
the failed write are counted as lost, a `meta.lost` record with the count goes first into
the next write, and a file that cannot be created is tried again once a second.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gpujitter.daemon.sinks.diskfull import WriteFailures, no_room, to_stderr
from gpujitter.daemon.sinks.rotation import Rotation, say_once
from gpujitter.daemon.sinks.trace import SUFFIX, TraceHeader, TraceWriter, encode
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import clock_ref
from gpujitter.probes.events import Event, RecordsLost

# gpujitter-20250101T120000.123456Z-<session>-000003.gjtrace: names sort in recording order
# (UTC start time first, to the microsecond: a daemon restarted at once still sorts after).
_SEGMENT_NAME = re.compile(
    r"^gpujitter-\d{8}T\d{6}\.\d{6}Z-(?P<session>[0-9a-f]+)-(?P<segment>\d{6,})"
    + re.escape(SUFFIX)
    + "$"
)


class TraceCapture:
    """Writes events into `target`: one trace file when `rotation` is None, else a directory
    where a new file (with its own header: same session, next segment, fresh clock
    reference) starts whenever the rotation policy says so, and the oldest files go when
    the retention limits are exceeded. Use from one thread; call `tick` about once a second
    (flush on time, rotate on age, retry a file the disk refused). `failures` counts the
    events lost to a failing disk (`say` is told when that starts and ends)."""

    def __init__(
        self,
        target: str | Path,
        header: TraceHeader,
        rotation: Rotation | None = None,
        *,
        flush_bytes: int = 256 << 10,
        flush_interval_ns: int = 1_000_000_000,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.target = Path(target)
        self.rotation = rotation
        # Per event only its size can make a file due (age is the tick's): the policy is
        # asked once the file would pass max_bytes, not for every event.
        self._due_above = rotation.max_bytes if rotation and rotation.max_bytes else sys.maxsize
        self.events = 0
        self.bytes_closed = 0  # bytes of the files already rotated out (deleted ones too)
        self.files: list[Path] = []  # every file this capture started, in order
        self.removed: list[Path] = []  # those deleted by retention
        self.failures = WriteFailures(f"trace {self.target}", say or to_stderr)
        self._cannot_delete = say_once(self.failures.what, self.failures.say)
        self._writer_opts = {"flush_bytes": flush_bytes, "flush_interval_ns": flush_interval_ns}
        self._marker_at: int | None = None  # on_disk of the writer when a meta.lost was queued
        if rotation is not None:
            if self.target.exists() and not self.target.is_dir():
                raise GpujitterError(f"{self.target}: rotation needs a directory, not a file")
            try:
                self.target.mkdir(mode=0o750, exist_ok=True)
            except OSError as err:
                raise GpujitterError(f"cannot create {self.target}: {err.strerror}") from None
        self._header = header
        self._writer: TraceWriter | None = None
        try:
            self._writer = self._open(header)
        except GpujitterError as err:
            # A disk that is full now may have room later: start, and try once a second.
            # A place that cannot be written at all is a configuration error.
            if not no_room(err):
                raise
            self.failures.failed(err, header.start_ns, 0)

    def _open(self, header: TraceHeader) -> TraceWriter:
        if self.rotation is None:
            path = self.target
        else:
            stamp = datetime.fromtimestamp(header.start_wall_ns / 1e9, UTC)
            name = f"gpujitter-{stamp:%Y%m%dT%H%M%S.%f}Z-{header.session}-{header.segment:06d}"
            path = self.target / (name + SUFFIX)
        writer = TraceWriter(path, header, **self._writer_opts)
        self._header = header
        self.files.append(path)
        self._started_ns = header.start_ns
        if self.rotation is not None:
            try:
                segments = self._set()
            except OSError as err:  # the directory went away after the file was made
                self._cannot_delete(self.target, err)
            else:
                self.removed += self.rotation.prune(segments, self._cannot_delete)
        return writer

    def _set(self) -> list[Path]:
        """This directory's trace files, oldest first, ending with the one being written.
        Other sessions' names sort by start time on the wall clock; this session's own files
        come after every other's, in the order it wrote them (segment numbers), whatever
        their names say: a clock set back, now or in an earlier run that ran ahead, must not
        make retention delete what this run just wrote."""
        current = self.files[-1]
        found = (
            (p, m)
            for p in self.target.iterdir()
            if p != current and (m := _SEGMENT_NAME.match(p.name))
        )

        def age(pm: tuple[Path, re.Match[str]]) -> tuple[bool, int, str]:
            p, m = pm
            if m["session"] == self._header.session:
                return (True, int(m["segment"]), "")
            return (False, 0, p.name)

        return [*(p for p, _ in sorted(found, key=age)), current]

    @property
    def path(self) -> Path:
        """The file being written (or last written, while none can be created)."""
        return self.files[-1] if self.files else self.target

    @property
    def bytes(self) -> int:
        """Bytes recorded, headers included, over all files."""
        return self.bytes_closed + (self._writer.size if self._writer else 0)

    def write(self, ev: Event) -> None:
        self.events += 1
        data = encode(ev)
        w = self._writer
        if (
            w is not None
            and w.size + len(data) > self._due_above
            and self._rotation_due(w.size + len(data), 0)
        ):
            self.rotate()
        w = self._writer
        if w is None:
            self.failures.lost()  # no file to write to
            return
        if self._marker_at is None and w.buffer(data):
            return  # into the buffer only: nothing can fail, nothing to recover
        self._guarded(w, lambda w: w.append(data), ev.ts_ns)

    def tick(self, now_ns: int | None = None) -> None:
        """Flush what waited long enough; rotate a file that got too old; try again to
        create the next file when the disk refused it."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        if self._writer is None:
            self._next_file()
        if self._writer is not None:
            self._guarded(self._writer, lambda w: w.flush_if_due(now_ns), now_ns)
        w = self._writer
        if w is not None and self._rotation_due(w.size, now_ns - self._started_ns):
            self.rotate()

    def _guarded(self, w: TraceWriter, step: Callable[[TraceWriter], object], ts_ns: int) -> None:
        """Run one step of writer `w`; what a failing disk costs is counted, not raised."""
        lost_before = w.lost_events
        try:
            step(w)
        except GpujitterError as err:
            frames = w.lost_events - lost_before
            if self._marker_at is not None:
                frames -= 1  # the meta.lost record that went with them is no event
            self.failures.failed(err, ts_ns, frames)
            self._marker_at = None
            if w is self._writer:
                self._queue_marker(w, ts_ns)
            return
        if self._marker_at is not None and w.on_disk > self._marker_at:
            self._marker_at = None  # the meta.lost record is in the file: writing works
            self.failures.recovered()

    def _queue_marker(self, w: TraceWriter, ts_ns: int) -> None:
        """Put a meta.lost record with the episode's count first in the (empty) buffer: the
        next write that works carries it, and a failing one drops it with the rest."""
        f = self.failures
        lost = RecordsLost(ts_ns=ts_ns, count=f.dropped, since_ns=f.since_ns, reason=f.reason)
        self._marker_at = w.on_disk
        w.append(encode(lost))

    def _rotation_due(self, size: int, age_ns: int) -> bool:
        # A file without events is never closed: each one holds at least one record.
        return (
            self.rotation is not None
            and self._writer is not None
            and self._writer.events > 0
            and self.rotation.due(size, age_ns)
        )

    def rotate(self) -> None:
        """Close the current file (fsynced) and start the next segment; a file without
        events is kept on (reloads in a row must not make empty files that push recorded
        ones out of retention)."""
        old = self._writer
        if old is not None and old.events == 0:
            return
        if old is not None:
            self._writer = None
            self._close(old)
            self.bytes_closed += old.size
        self._next_file()

    def _next_file(self) -> None:
        header = dataclasses.replace(
            self._header,
            segment=self._header.segment + 1,
            clock=clock_ref(),
            start_ns=time.monotonic_ns(),
        )
        try:
            self._writer = self._open(header)
        except GpujitterError as err:
            self.failures.failed(err, header.start_ns, 0)
            return
        if self.failures.failing:
            self._queue_marker(self._writer, header.start_ns)

    def _close(self, w: TraceWriter) -> None:
        self._guarded(w, lambda w: w.close(), time.monotonic_ns())
        self._marker_at = None

    def close(self) -> None:
        if self._writer is not None:
            self._close(self._writer)
            self.bytes_closed += self._writer.size
            self._writer = None
        if self.failures.failing:
            f = self.failures
            f.say(f"{f.what}: stopped with {f.dropped} events lost since the disk failed")

    def __enter__(self) -> TraceCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
