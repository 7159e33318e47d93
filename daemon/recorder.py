"""Recording the raw event stream: a bounded queue that any event source (probe thread, GPU
side) feeds from its own thread, and a recorder that writes what comes out of it into one
trace file or a rotating directory of them (`gpujitter record -o`, the daemon's `--record`).
"""

from __future__ import annotations

import dataclasses
import queue
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from gpujitter.daemon.rotation import Rotation
from gpujitter.daemon.trace import SUFFIX, TraceHeader, TraceWriter, encode
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import clock_ref
from gpujitter.probes.events import Event


class EventQueue:
    """Fan-in from event sources to one consumer thread. `emit` is what a source calls (the
    probes' Emit): it never blocks; when the consumer falls `maxsize` events behind, the
    event is dropped, counted in `dropped`, and emit returns False so the probe counts it
    as lost too."""

    def __init__(self, maxsize: int = 65536) -> None:
        self._queue: queue.Queue[Event] = queue.Queue(maxsize)
        self.dropped = 0

    def emit(self, ev: Event) -> bool:
        try:
            self._queue.put_nowait(ev)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def drain(self, timeout_s: float = 0.0, limit: int = 10_000) -> Iterator[Event]:
        """What is queued (up to `limit`), waiting up to timeout_s for the first event."""
        try:
            yield self._queue.get(timeout=timeout_s) if timeout_s else self._queue.get_nowait()
            for _ in range(limit - 1):
                yield self._queue.get_nowait()
        except queue.Empty:
            return


# gpujitter-20250101T120000.123456Z-<session>-000003.gjtrace: names sort in recording order
# (UTC start time first, to the microsecond: a daemon restarted at once still sorts after).
_SEGMENT_NAME = re.compile(
    r"^gpujitter-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]+-\d{6,}" + re.escape(SUFFIX) + "$"
)


class TraceRecorder:
    """Writes events into `target`: one trace file when `rotation` is None, else a directory
    where a new file (with its own header: same session, next segment, fresh clock
    reference) starts whenever the rotation policy says so, and the oldest files go when
    the retention limits are exceeded. Use from one thread; call `tick` about once a second
    (flush on time, rotate on age)."""

    def __init__(
        self,
        target: str | Path,
        header: TraceHeader,
        rotation: Rotation | None = None,
        *,
        flush_bytes: int = 256 << 10,
        flush_interval_ns: int = 1_000_000_000,
    ) -> None:
        self.target = Path(target)
        self.rotation = rotation
        self.events = 0
        self.bytes_closed = 0  # bytes of the files already rotated out (deleted ones too)
        self.files: list[Path] = []  # every file this recorder started, in order
        self.removed: list[Path] = []  # those deleted by retention
        self._writer_opts = {"flush_bytes": flush_bytes, "flush_interval_ns": flush_interval_ns}
        if rotation is not None:
            if self.target.exists() and not self.target.is_dir():
                raise GpujitterError(f"{self.target}: rotation needs a directory, not a file")
            try:
                self.target.mkdir(mode=0o750, exist_ok=True)
            except OSError as err:
                raise GpujitterError(f"cannot create {self.target}: {err.strerror}") from None
        self._writer = self._open(header)

    def _open(self, header: TraceHeader) -> TraceWriter:
        if self.rotation is None:
            path = self.target
        else:
            stamp = datetime.fromtimestamp(header.start_wall_ns / 1e9, UTC)
            name = f"gpujitter-{stamp:%Y%m%dT%H%M%S.%f}Z-{header.session}-{header.segment:06d}"
            path = self.target / (name + SUFFIX)
        writer = TraceWriter(path, header, **self._writer_opts)
        self.files.append(path)
        self._started_ns = header.start_ns
        if self.rotation is not None:
            self.removed += self.rotation.prune(self._set())
        return writer

    def _set(self) -> list[Path]:
        """This directory's trace files, oldest first (names sort by start time), ending
        with the one being written."""
        current = self.files[-1]
        older = sorted(
            p for p in self.target.iterdir() if _SEGMENT_NAME.match(p.name) and p != current
        )
        return [*older, current]

    @property
    def path(self) -> Path:
        """The file being written."""
        return self._writer.path

    @property
    def bytes(self) -> int:
        """Bytes recorded, headers included, over all files."""
        return self.bytes_closed + self._writer.size

    def write(self, ev: Event) -> None:
        data = encode(ev)
        if self._rotation_due(self._writer.size + len(data), 0):
            self.rotate()
        self._writer.append(data)
        self.events += 1

    def tick(self, now_ns: int | None = None) -> None:
        """Flush what waited long enough; rotate a file that got too old."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        self._writer.flush_if_due(now_ns)
        if self._rotation_due(self._writer.size, now_ns - self._started_ns):
            self.rotate()

    def _rotation_due(self, size: int, age_ns: int) -> bool:
        # A file without events is never closed: each one holds at least one record.
        return (
            self.rotation is not None
            and self._writer.events > 0
            and self.rotation.due(size, age_ns)
        )

    def rotate(self) -> None:
        """Close the current file (fsynced) and start the next segment."""
        old = self._writer
        old.close()
        self.bytes_closed += old.size
        header = dataclasses.replace(
            old.header,
            segment=old.header.segment + 1,
            clock=clock_ref(),
            start_ns=time.monotonic_ns(),
        )
        self._writer = self._open(header)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
