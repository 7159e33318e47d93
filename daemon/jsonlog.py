"""The daemon's attribution log: JSON lines, one record per line, each carrying its schema
("schema": "gpujitter.attribution/1"), so any line read alone (grep, tail, a rotated file)
says how to read it. docs/schema.md describes the records.

Each line goes to the file in one write() on an O_APPEND descriptor, so a crash can leave
only the last line incomplete; reopening the file cuts such a torn line off before writing
again. Rotation by size keeps name.1 (newest) .. name.N; `reopen()` (on SIGHUP) starts a
new file after logrotate has moved the old one away.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from gpujitter.daemon.rotation import Rotation, fsync_dir
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import SCHEMA_MAJOR, Event, to_record
from gpujitter.text import inert_json

LOG_SCHEMA = f"gpujitter.attribution/{SCHEMA_MAJOR}"
_TAIL_CHUNK = 1 << 16


def rotated_files(path: Path) -> list[Path]:
    """The log and its rotated files, oldest first: name.N .. name.1, name (if present)."""
    numbered = []
    k = 1
    while (candidate := path.with_name(f"{path.name}.{k}")).exists():
        numbered.append(candidate)
        k += 1
    current = [path] if path.exists() else []
    return [*reversed(numbered), *current]


class JsonLog:
    """Appends records as JSON lines to `path` (created with `mode`, whatever the umask).
    Safe to call from several threads. `repaired_bytes`: how much of a torn last line a
    previous crash left, cut off when the file was (re)opened."""

    def __init__(
        self,
        path: str | Path,
        rotation: Rotation | None = None,
        *,
        schema: str = LOG_SCHEMA,
        mode: int = 0o640,
    ) -> None:
        self.path = Path(path)
        self.rotation = rotation
        self.schema = schema
        self.mode = mode
        self.lines = 0
        self.repaired_bytes = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._open()

    def _open(self) -> None:
        # Read access too: a torn last line is found by reading the tail.
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
        fd = -1
        try:
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, self.mode)
                os.fchmod(fd, self.mode)
            except FileExistsError:
                fd = os.open(self.path, flags)
            self.size = self._cut_torn_line(fd)
        except OSError as err:
            if fd >= 0:
                os.close(fd)
            raise GpujitterError(f"cannot open log {self.path}: {err.strerror}") from None
        self._fd = fd
        self._opened_ns = time.monotonic_ns()

    def _cut_torn_line(self, fd: int) -> int:
        """Truncate a last line without its newline (a crash mid-write); returns the size."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return size
        keep = pos = 0
        for pos in range(size, 0, -_TAIL_CHUNK):
            start = max(0, pos - _TAIL_CHUNK)
            newline = os.pread(fd, pos - start, start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
        os.ftruncate(fd, keep)
        self.repaired_bytes += size - keep
        return keep

    def write(self, record: Event | Mapping[str, Any]) -> None:
        """Append one record (an event, or a plain mapping) as one line."""
        rec = to_record(record) if isinstance(record, Event) else record
        # inert_json: names in it are other processes' choice, and people `tail -f` a log.
        line = inert_json(orjson.dumps({"schema": self.schema, **rec})) + b"\n"
        with self._lock:
            if self._fd is None:
                raise GpujitterError(f"log {self.path} written after close")
            age_ns = time.monotonic_ns() - self._opened_ns
            if self.rotation and self.size and self.rotation.due(self.size + len(line), age_ns):
                self._rotate()
            self._append(line)

    def _append(self, line: bytes) -> None:
        assert self._fd is not None
        try:
            written = os.write(self._fd, line)
        except OSError as err:
            raise GpujitterError(f"cannot write log {self.path}: {err.strerror}") from None
        if written != len(line):
            # Disk full mid-line: take the fragment back so no broken line stays behind.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.size)
            raise GpujitterError(f"cannot write log {self.path}: short write (disk full?)")
        self.size += written
        self.lines += 1

    def _rotate(self) -> None:
        assert self._fd is not None and self.rotation is not None
        os.close(self._fd)
        self._fd = None
        try:
            for older in rotated_files(self.path):  # oldest first: no rename overwrites
                suffix = older.name[len(self.path.name) :]
                k = int(suffix[1:]) if suffix else 0
                older.rename(self.path.with_name(f"{self.path.name}.{k + 1}"))
            fsync_dir(self.path.parent)
        except OSError as err:
            raise GpujitterError(f"cannot rotate log {self.path}: {err.strerror}") from None
        finally:
            self._open()  # the new file, or the same one again when renaming failed
        self.rotation.prune(rotated_files(self.path))

    def reopen(self) -> None:
        """Close and open the path again: after logrotate renamed the file (SIGHUP), new
        lines go to a new file at the configured name."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._open()

    def close(self) -> None:
        """fsync and close; the log is then durable up to its last line."""
        with self._lock:
            if self._fd is None:
                return
            try:
                os.fsync(self._fd)
            except OSError as err:
                raise GpujitterError(f"cannot write log {self.path}: {err.strerror}") from None
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> JsonLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JsonLogReader:
    """Reads a log (and its rotated files, oldest first, with `rotated=True`) line by line.
    A torn last line of a file is skipped and counted in `torn_bytes`; a broken line
    elsewhere, or a record of another schema major, raises GpujitterError with one line."""

    def __init__(self, path: str | Path, *, rotated: bool = False, schema: str = LOG_SCHEMA):
        self.path = Path(path)
        self.files = rotated_files(self.path) if rotated else [self.path]
        self.schema_prefix = schema.rsplit("/", 1)[0] + "/"
        self.major = schema.rsplit("/", 1)[1]
        self.torn_bytes = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.torn_bytes = 0
        for path in self.files:
            yield from self._read(path)

    def _read(self, path: Path) -> Iterator[dict[str, Any]]:
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed below, also when the caller stops)
        except OSError as err:
            raise GpujitterError(f"cannot open log {path}: {err.strerror}") from None
        with f:
            for lineno, line in enumerate(f, start=1):
                if not line.endswith(b"\n"):
                    self.torn_bytes += len(line)
                    return
                yield self._parse(path, lineno, line)

    def _parse(self, path: Path, lineno: int, line: bytes) -> dict[str, Any]:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise GpujitterError(f"{path}:{lineno}: not a JSON line; the log is damaged") from None
        schema = rec.get("schema") if isinstance(rec, dict) else None
        if not isinstance(schema, str) or not schema.startswith(self.schema_prefix):
            raise GpujitterError(f"{path}:{lineno}: not a {self.schema_prefix}N record")
        if schema[len(self.schema_prefix) :] != self.major:
            raise GpujitterError(
                f"{path}:{lineno}: record of schema {schema}; this gpujitter reads "
                f"{self.schema_prefix}{self.major}"
            )
        return dict(rec)
