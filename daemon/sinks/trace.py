"""The trace file: a checksummed header and one checksummed frame per event, written and read
as a stream (a trace of hours never has to fit in memory). docs/trace-format.md has the byte
layout, the compatibility rules and what a reader does with each kind of damage.

    preamble  magic "\\x89GJTRACE", format major u16, minor u16, crc32 of those 12 bytes
    frame     length u32, crc32(payload) u32, crc32(the 8 bytes before) u32, payload
    file      preamble, header frame (JSON object), event frames (JSON, probes/events.py)

All integers little-endian; crc32 is zlib's (IEEE 802.3).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import os
import socket
import stat
import struct
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gpujitter import __version__
from gpujitter.daemon.analysis import records  # noqa: F401 (registers the daemon's event kinds)
from gpujitter.daemon.sinks.jsonlog import ZEROS_LOST
from gpujitter.daemon.sinks.rotation import fsync_dir
from gpujitter.errors import GpujitterError
from gpujitter.files import open_regular
from gpujitter.probes.clock import clock_ref, stepped, wall_ns
from gpujitter.probes.events import (
    SCHEMA_MAJOR,
    SCHEMA_MINOR,
    BadRecord,
    ClockRef,
    Event,
    event_kinds,
    from_record,
    to_json,
    typed,
)
from gpujitter.probes.host import HostPaths, boot_id
from gpujitter.probes.topology import Topology

MAGIC = b"\x89GJTRACE"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1  # 1.1: the header's boot_id
SUFFIX = ".gjtrace"

_PREAMBLE = struct.Struct("<8sHH")  # then crc32 of these 12 bytes
PREAMBLE_SIZE = _PREAMBLE.size + 4
_FRAME = struct.Struct("<III")  # payload length, crc32(payload), crc32(first 8 bytes)
_LENGTH_CRC = struct.Struct("<II")
_CRC = struct.Struct("<I")
FRAME_HEADER_SIZE = _FRAME.size
# No writer makes a record this large; a checksummed length above it is a writer bug.
MAX_PAYLOAD_BYTES = 16 << 20
_PAYLOAD_START = b'{"type":'  # how every frame's payload begins (frame(to_json(ev)))
_CHUNK = 1 << 16


def preamble(major: int = FORMAT_MAJOR, minor: int = FORMAT_MINOR) -> bytes:
    head = _PREAMBLE.pack(MAGIC, major, minor)
    return head + struct.pack("<I", zlib.crc32(head))


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise GpujitterError(f"a record of {len(payload)} bytes is larger than a trace holds")
    head = _LENGTH_CRC.pack(len(payload), zlib.crc32(payload))
    return head + _CRC.pack(zlib.crc32(head)) + payload


def encode(ev: Event) -> bytes:
    """An event as the frame a trace stores: the JSON of to_record(ev) (to_json: the daemon
    captures every event it takes)."""
    return frame(to_json(ev))


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """What a reader needs to interpret the events: where and when they were recorded, with
    which probes and thresholds, the node's topology, and the monotonic<->wall reference.
    session: one id per recording, shared by all files of a rotated set; segment: the
    file's place in that set (0, 1, ...)."""

    host: str
    kernel: str
    topology: Topology
    clock: ClockRef
    start_ns: int  # CLOCK_MONOTONIC when this file was started
    probes: tuple[str, ...]
    thresholds: Mapping[str, Mapping[str, int]]  # probe -> key -> ns, defaults included
    watch: str = ""  # which processes were watched, as people read it
    gpujitter: str = __version__
    schema: tuple[int, int] = (SCHEMA_MAJOR, SCHEMA_MINOR)  # of the events (docs/schema.md)
    session: str = ""
    segment: int = 0
    # The node's boot (/proc/sys/kernel/random/boot_id): files of one boot share a monotonic
    # clock; "" in files of writers before format 1.1
    boot_id: str = ""
    # Gap-detection and attribution settings in force while recording (AnalysisConfig),
    # so that `report` replays with them; empty: the defaults of the reading version.
    analysis: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def now(
        cls,
        topology: Topology,
        probes: Iterable[str],
        thresholds: Mapping[str, Mapping[str, int]],
        watch: str = "",
        analysis: Mapping[str, Any] | None = None,
        paths: HostPaths | None = None,
    ) -> TraceHeader:
        """This node's header now; `paths`: where its /proc is (a recorded tree in tests)."""
        uname = os.uname()
        return cls(
            host=socket.gethostname(),
            kernel=uname.release,
            topology=topology,
            clock=clock_ref(),
            start_ns=time.monotonic_ns(),
            probes=tuple(probes),
            thresholds={p: dict(t) for p, t in thresholds.items()},
            watch=watch,
            session=uuid.uuid4().hex[:12],
            boot_id=boot_id(paths or HostPaths()),
            analysis=dict(analysis or {}),
        )

    @property
    def start_wall_ns(self) -> int:
        return wall_ns(self.clock, self.start_ns)

    def to_record(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "kernel": self.kernel,
            "gpujitter": self.gpujitter,
            "schema": list(self.schema),
            "session": self.session,
            "segment": self.segment,
            "boot_id": self.boot_id,
            "start_ns": self.start_ns,
            "clock": {"ts_ns": self.clock.ts_ns, "realtime_ns": self.clock.realtime_ns},
            "probes": list(self.probes),
            "thresholds": {p: dict(t) for p, t in self.thresholds.items()},
            "watch": self.watch,
            "topology": self.topology.to_record(),
            "analysis": dict(self.analysis),
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> TraceHeader:
        """Inverse of to_record, every key checked against its type; keys a newer minor
        version added are ignored. Raises BadRecord naming the key that is missing or of the
        wrong type (the reader words it)."""
        rec = typed(dict[str, Any], rec)

        def key(name: str, hint: Any, *default: Any) -> Any:
            if name not in rec and not default:
                raise BadRecord(f"no {name!r}")
            return typed(hint, rec.get(name, *default), name)

        schema = key("schema", tuple[int, int])  # first: another major may differ anywhere
        return cls(
            host=key("host", str),
            kernel=key("kernel", str),
            topology=Topology.from_record(key("topology", dict[str, Any])),
            clock=key("clock", ClockRef),
            start_ns=key("start_ns", int),
            probes=key("probes", tuple[str, ...]),
            thresholds=key("thresholds", dict[str, dict[str, int]]),
            watch=key("watch", str, ""),
            gpujitter=key("gpujitter", str),
            schema=schema,
            session=key("session", str, ""),
            segment=key("segment", int, 0),
            boot_id=key("boot_id", str, ""),
            analysis=key("analysis", dict[str, Any], {}),
        )


def _io_error(path: Path, what: str, err: OSError) -> GpujitterError:
    return GpujitterError(f"cannot {what} {path}: {err.strerror or err}")


def _exists(path: Path) -> GpujitterError:
    return GpujitterError(f"{path} exists; remove it or choose another name")


def _put_in_place(tmp: Path, path: Path) -> None:
    """`tmp` renamed to `path`, never over a file made there since it was checked (another
    recorder's): a link fails where a rename would replace. A file system without hard links
    gets the rename."""
    try:
        os.link(tmp, path)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP):
            raise
        os.rename(tmp, path)
        return
    os.unlink(tmp)


# Where an unnamed file gets its name from (_link_unnamed).
_OWN_FDS = "/proc/self/fd"


@functools.cache
def _can_name_unnamed() -> bool:
    """Whether this process has a /proc to link unnamed files through (asked once)."""
    return os.path.isdir(_OWN_FDS)


def _create_unnamed(directory: Path, mode: int) -> int | None:
    """A file in `directory` with no name (O_TMPFILE) until a link puts it in place: no other
    recorder can reach it (two at one name once took each other's NAME.tmp: one linked the
    other's file in place and went on writing to its own, unlinked), and a crash leaves
    nothing behind. None where the file system has no such files, or where there is no
    /proc to link one through (a chroot, a container without it)."""
    if not _can_name_unnamed():
        return None
    try:
        return os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def _link_unnamed(fd: int, path: Path) -> None:
    """The unnamed file `fd` given its name; a link never replaces, so a file made there
    meanwhile is kept (FileExistsError). Through /proc with AT_SYMLINK_FOLLOW, which needs no
    privilege (AT_EMPTY_PATH would); os.link asks for that flag only given a directory fd,
    and without it links the /proc entry itself (EXDEV)."""
    fds = os.open(_OWN_FDS, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=fds, follow_symlinks=True)
    finally:
        os.close(fds)


def _create(path: Path, mode: int) -> int:
    """A new file at `path`, never one reached through a link: the daemon runs as root, and
    a link planted at the name would have it empty and overwrite any file. What a crash
    left there (a NAME.tmp not renamed) is removed first, not followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, mode)
    except FileExistsError:
        path.unlink()  # the link itself, not what it points to
        return os.open(path, flags, mode)


class TraceWriter:
    """Appends events to a new trace file. Frames collect in a buffer that goes to the file in
    one write when it reaches `flush_bytes` or when `flush_if_due` finds it older than
    `flush_interval_ns`, so a crash loses at most that much and tears at most the last frame.
    The header is fsynced at creation and the file on close.

    The file appears under its name only once its header is on disk (written to a file with
    no name, or NAME.tmp where the file system has none, then linked in place), so every
    trace a reader finds has a complete header."""

    def __init__(
        self,
        path: str | Path,
        header: TraceHeader,
        *,
        flush_bytes: int = 256 << 10,
        flush_interval_ns: int = 1_000_000_000,
        mode: int = 0o640,
    ) -> None:
        self.path = Path(path)
        self.header = header
        self.flush_bytes = flush_bytes
        self.flush_interval_ns = flush_interval_ns
        self.events = 0
        self.buffered_events = 0  # frames waiting in the buffer
        self.lost_events = 0  # frames a failed write dropped (the file is cut back instead)
        self._buf = bytearray()
        self._last_flush_ns = time.monotonic_ns()
        if self.path.exists():
            raise _exists(self.path)
        tmp: Path | None = None  # the named temporary file, where no unnamed one can be made
        try:
            fd = _create_unnamed(self.path.parent, mode)
            if fd is None:
                tmp = self.path.with_name(self.path.name + ".tmp")
                fd = _create(tmp, mode)
        except OSError as err:
            raise _io_error(self.path, "create", err) from None
        self._fd: int | None = fd
        try:
            os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
            head = preamble() + frame(orjson.dumps(header.to_record()))
            self._write(head)
            os.fsync(fd)
            if tmp is None:
                _link_unnamed(fd, self.path)
            else:
                _put_in_place(tmp, self.path)
            fsync_dir(self.path.parent)
        except FileExistsError:
            self._abandon(tmp)
            raise _exists(self.path) from None
        except OSError as err:
            self._abandon(tmp)
            raise _io_error(self.path, "write", err) from None
        self._on_disk = len(head)
        self.size = len(head)  # bytes in the file and in the buffer

    def _abandon(self, tmp: Path | None) -> None:
        """The file not put in place: closed (an unnamed one is gone with it), a named
        temporary file removed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if tmp is not None:
            tmp.unlink(missing_ok=True)

    def write(self, ev: Event) -> int:
        """Append one event; returns the bytes it takes in the file."""
        return self.append(encode(ev))

    def append(self, data: bytes) -> int:
        """Append one frame made by `encode`; a full buffer goes to the file."""
        if not self.buffer(data, fill=True):
            self.flush()
        return len(data)

    def buffer(self, data: bytes, fill: bool = False) -> bool:
        """Put one frame made by `encode` in the buffer when it leaves room there (then
        nothing can fail: the capture's per-event path, in one call); False when it would
        fill the buffer, which takes it even so with `fill` (the caller writes it out)."""
        room = len(self._buf) + len(data) < self.flush_bytes
        if room or fill:
            self._buf += data
            self.size += len(data)
            self.events += 1
            self.buffered_events += 1
        return room

    def flush_if_due(self, now_ns: int | None = None) -> None:
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        if self._buf and now_ns - self._last_flush_ns >= self.flush_interval_ns:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered frames to the kernel (one write; no fsync). When the write fails
        (disk full), the file is cut back to its last whole frame and the error raised."""
        self._last_flush_ns = time.monotonic_ns()
        if not self._buf:
            return
        buffered, self.buffered_events = self.buffered_events, 0
        try:
            self._write(self._buf)
        except OSError as err:
            self._buf = bytearray()  # not clear(): the failed write's view may still hold it
            with contextlib.suppress(OSError):
                # Back to the last whole frame, the offset too: the next write that works
                # must continue there, not past a hole the partial write left.
                os.ftruncate(self._fd_open(), self._on_disk)
                os.lseek(self._fd_open(), self._on_disk, os.SEEK_SET)
            self.size = self._on_disk
            self.lost_events += buffered
            raise _io_error(self.path, "write", err) from None
        self._on_disk += len(self._buf)
        self._buf.clear()

    @property
    def on_disk(self) -> int:
        """Bytes handed to the file (the rest is in the buffer)."""
        return self._on_disk

    def close(self) -> None:
        """Flush and fsync; the file is then a complete trace."""
        if self._fd is None:
            return
        try:
            self.flush()
            os.fsync(self._fd)
        except OSError as err:
            raise _io_error(self.path, "write", err) from None
        finally:
            os.close(self._fd)
            self._fd = None

    def _fd_open(self) -> int:
        if self._fd is None:
            raise GpujitterError(f"{self.path}: trace writer used after close")
        return self._fd

    def _write(self, data: bytes | bytearray) -> None:
        fd = self._fd_open()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _TornTail(Exception):
    """The data ends inside a frame: the writer stopped mid-write, or (`zeros`) a crash's
    block of zeros from the frame's start to the end that never reached the disk."""

    def __init__(self, *, zeros: bool = False) -> None:
        super().__init__()
        self.zeros = zeros


class _BadPayload(Exception):
    """A frame whose payload fails its checksum, not the last: its header's length (which
    has a checksum of its own) says where the next frame starts, and the file is there."""


class _Unframed(Exception):
    """A frame header that fails its checksum before the end: where the next frame starts
    is not known, so nothing after it can be read."""


class TraceReader:
    """Reads one trace file as a stream of events. Opening reads and checks the preamble and
    header (damage there raises GpujitterError with one line: without them nothing can be
    read). Iterating yields events in file order, and every other damage is read past where
    it can be and reported (docs/trace-format.md): a torn last frame (crash mid-write) or a
    zero-filled tail ends the stream (`torn_tail_bytes`); records of kinds this version does
    not know (a newer writer) are skipped (`skipped`); a record whose checksum fails, or
    that is checksummed but malformed, is skipped (`corrupt`, the first in `corrupt_at`); a
    frame header whose checksum fails ends the read there (`unread_bytes`). Nothing is
    dropped without a note in damage_notes(); `damaged` tells the last three apart from
    what a writer's crash or a newer version leaves."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records = 0
        self.skipped: Counter[str] = Counter()
        self.torn_tail_bytes = 0
        self.torn_tail_zeros = 0  # of those, zeros (a crash's block that never reached disk)
        self.corrupt = 0
        self.corrupt_at = ""  # the first corrupt record: what and where
        self.unread_bytes = 0  # past damaged frame headers, to the next intact frame
        self.unread_at = ""
        self.unread_to_end = False  # no intact frame after the last damaged header
        # A regular file only: a FIFO among a directory's traces would block the open (the
        # paths named were sniffed before; those found in a directory were not).
        self._file: BinaryIO = open_regular(self.path, "cannot open")
        try:
            self.format_version = self._read_preamble()
            self.header = self._read_header()
        except BaseException:
            self._file.close()
            raise
        self._data_start = self._file.tell()

    def _fail(self, offset: int, what: str) -> GpujitterError:
        return GpujitterError(f"{self.path}: {what} at byte {offset}; the trace is damaged")

    def _read_preamble(self) -> tuple[int, int]:
        raw = self._file.read(PREAMBLE_SIZE)
        if not raw:
            raise GpujitterError(f"{self.path}: empty file, not a gpujitter trace")
        if raw[: len(MAGIC)] != MAGIC[: len(raw)]:
            raise GpujitterError(f"{self.path}: not a gpujitter trace (no trace magic)")
        if len(raw) < PREAMBLE_SIZE:
            raise GpujitterError(f"{self.path}: truncated trace header ({len(raw)} bytes)")
        _, major, minor = _PREAMBLE.unpack_from(raw)
        (crc,) = struct.unpack_from("<I", raw, _PREAMBLE.size)
        if zlib.crc32(raw[: _PREAMBLE.size]) != crc:
            raise self._fail(0, "corrupt preamble (checksum mismatch)")
        if major != FORMAT_MAJOR:
            raise GpujitterError(
                f"{self.path}: trace format {major}.{minor} is not readable by gpujitter "
                f"{__version__} (reads {FORMAT_MAJOR}.x)"
            )
        return major, minor

    def _read_header(self) -> TraceHeader:
        payload = self._header_frame(PREAMBLE_SIZE)
        if payload is None:
            raise GpujitterError(f"{self.path}: truncated trace header")
        try:
            header = TraceHeader.from_record(orjson.loads(payload))
        except orjson.JSONDecodeError as err:
            raise self._fail(PREAMBLE_SIZE, f"malformed trace header (not JSON: {err})") from None
        except BadRecord as err:
            raise self._fail(PREAMBLE_SIZE, f"malformed trace header ({err})") from None
        if header.schema[0] != SCHEMA_MAJOR:
            raise GpujitterError(
                f"{self.path}: events of schema {header.schema[0]}.{header.schema[1]} are not "
                f"readable by gpujitter {__version__} (reads {SCHEMA_MAJOR}.x)"
            )
        return header

    def _header_frame(self, offset: int) -> bytes | None:
        """The payload of the header's frame at `offset` (where the file is positioned), None
        where the file ends inside it; damage raises: without the header nothing is read."""
        try:
            return self._frame_at(offset)
        except _TornTail:
            return None
        except _BadPayload:
            raise self._fail(offset, "corrupt trace header (checksum mismatch)") from None
        except _Unframed as what:
            raise self._fail(offset, f"trace header: {what}") from None

    def _frame_at(self, offset: int) -> bytes | None:
        head = self._file.read(FRAME_HEADER_SIZE)
        if not head:
            return None
        if len(head) < FRAME_HEADER_SIZE:
            raise _TornTail
        length, payload_crc, head_crc = _FRAME.unpack(head)
        if zlib.crc32(head[:8]) != head_crc:
            if not any(head) and self._rest_is_zero():  # size grew, data never landed
                raise _TornTail(zeros=True)
            raise _Unframed("corrupt record header (checksum mismatch)")
        if length > MAX_PAYLOAD_BYTES:
            raise _Unframed(f"record of {length} bytes (larger than any writer makes)")
        payload = self._file.read(length)
        if len(payload) < length:
            raise _TornTail
        if zlib.crc32(payload) != payload_crc:
            if not self._file.read(1):  # the last frame, written only in part
                raise _TornTail
            self._file.seek(-1, os.SEEK_CUR)
            raise _BadPayload
        return payload

    def _corrupt(self, offset: int, what: str) -> None:
        """A damaged record, skipped and counted."""
        self.corrupt += 1
        if not self.corrupt_at:
            self.corrupt_at = f"{what} at byte {offset}"

    @property
    def damaged(self) -> bool:
        """Whether the last iteration met damage beyond a torn tail or unknown kinds: records
        that were there could not be read."""
        return bool(self.corrupt or self.unread_bytes)

    def _rest_is_zero(self) -> bool:
        """Whether nothing but zeros follows. The holes of a sparse file (a size set with no
        data written, as a crash can leave it) are skipped, not read: gigabytes of them took
        half a minute to read through."""
        fd = self._file.fileno()
        pos = self._file.tell()
        while True:
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as err:
                if err.errno == errno.ENXIO:  # only a hole from here to the end
                    return True
                break  # no SEEK_DATA on this file system: every byte is read
            self._file.seek(pos)
            chunk = self._file.read(_CHUNK)
            if not chunk:
                return True
            if any(chunk):
                return False
            pos += len(chunk)
        self._file.seek(pos)
        while chunk := self._file.read(_CHUNK):
            if any(chunk):
                return False
        return True

    def _zeros_from(self, offset: int) -> int:
        """The zero bytes of the torn last frame at `offset` past its frame header (whose
        length holds zeros; a JSON payload none): at most the longest frame a writer makes."""
        self._file.seek(offset + FRAME_HEADER_SIZE)
        zeros = 0
        while chunk := self._file.read(_CHUNK):
            zeros += chunk.count(0)
        return zeros

    def raw(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(offset, record dict) for every intact frame after the header, unknown kinds
        included; damage is counted (restarting on every call), not raised."""
        self._file.seek(self._data_start)
        self.torn_tail_bytes = self.torn_tail_zeros = self.corrupt = self.unread_bytes = 0
        self.corrupt_at = self.unread_at = ""
        self.unread_to_end = False
        offset = self._data_start
        while True:
            try:
                payload = self._frame_at(offset)
            except _TornTail as torn:
                self.torn_tail_bytes = self._size() - offset
                self.torn_tail_zeros = (
                    self.torn_tail_bytes if torn.zeros else self._zeros_from(offset)
                )
                return
            except _Unframed as what:
                found = self._next_frame(offset)
                self.unread_bytes += (self._size() if found is None else found) - offset
                self.unread_at = self.unread_at or f"{what} at byte {offset}"
                self.unread_to_end = found is None
                if found is None:
                    return
                self._file.seek(found)
                offset = found
                continue
            except _BadPayload:
                self._corrupt(offset, "corrupt record (checksum mismatch)")
                offset = self._file.tell()
                continue
            if payload is None:
                return
            try:
                rec = orjson.loads(payload)
            except orjson.JSONDecodeError as err:
                self._corrupt(offset, f"record is not JSON ({err})")
            else:
                if isinstance(rec, dict) and isinstance(rec.get("type"), str):
                    yield offset, rec
                else:
                    self._corrupt(offset, "record without a type")
            offset = self._file.tell()

    def _next_frame(self, offset: int) -> int | None:
        """Where the first intact frame after a damaged frame header at `offset` begins
        (None: none does). The damage is in the header, not in the frames after it: one
        flipped bit of a length lost the 1.9 MB of records that followed it. Every payload
        opens with its kind (`{"type":`), a header's length before it; a frame found there
        is taken when both its checksums hold. Looked for as far as the next frame can lie
        (the longest a writer makes), no further."""
        limit = offset + FRAME_HEADER_SIZE + MAX_PAYLOAD_BYTES
        at = offset + 1
        while at < limit:
            self._file.seek(at)
            chunk = self._file.read(min(16 * _CHUNK, limit - at) + len(_PAYLOAD_START))
            if len(chunk) <= len(_PAYLOAD_START):
                return None
            i = chunk.find(_PAYLOAD_START)
            while i >= 0:
                start = at + i - FRAME_HEADER_SIZE
                if start > offset:
                    self._file.seek(start)
                    with contextlib.suppress(_TornTail, _BadPayload, _Unframed):
                        if self._frame_at(start) is not None:
                            return start
                i = chunk.find(_PAYLOAD_START, i + 1)
            at += len(chunk) - len(_PAYLOAD_START)
        return None

    def _size(self) -> int:
        return os.fstat(self._file.fileno()).st_size

    @property
    def offset(self) -> int:
        """How far into the file reading has come (bytes), for progress."""
        return self._file.tell()

    def __iter__(self) -> Iterator[Event]:
        kinds = event_kinds()
        self.records = 0
        self.skipped = Counter()
        for index, (offset, rec) in enumerate(self.raw()):
            if rec["type"] not in kinds:
                self.skipped[rec["type"]] += 1
                continue
            try:
                ev = from_record(rec)
            except BadRecord as err:
                self._corrupt(offset, f"record {index}: {err}")
                continue
            self.records += 1
            yield ev

    def damage_notes(self) -> list[str]:
        """What the last iteration met, one line each (empty for an intact trace)."""
        notes = []
        if self.corrupt:
            notes.append(
                f"{self.path}: {self.corrupt} damaged record(s) skipped, the first: "
                f"{self.corrupt_at}; the trace is damaged"
            )
        if self.unread_bytes:
            which = "the last " if self.unread_to_end else ""
            notes.append(
                f"{self.path}: {self.unread_at}; {which}{self.unread_bytes} bytes could not "
                "be read (the trace is damaged)"
            )
        if self.torn_tail_bytes:
            why = (
                f", {self.torn_tail_zeros} of them zeros ({ZEROS_LOST})"
                if self.torn_tail_zeros
                else "; the writer stopped mid-write"
            )
            notes.append(
                f"{self.path}: torn last record dropped ({self.torn_tail_bytes} bytes{why})"
            )
        if self.skipped:
            kinds = ", ".join(f"{k} ({n})" for k, n in sorted(self.skipped.items()))
            notes.append(
                f"{self.path}: skipped {sum(self.skipped.values())} records of kinds this "
                f"version does not know (written by gpujitter {self.header.gpujitter}): {kinds}"
            )
        return notes

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def path_stat(path: Path) -> os.stat_result | None:
    """stat of what a user named, None where nothing is; a path this user may not reach (a
    directory on the way without search permission) is one line, not a traceback."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise GpujitterError(f"cannot read {path}: {err.strerror}") from None


def _listed(name: str) -> bool:
    """Whether a directory's entry is one of its traces, as the glob *.gjtrace finds them."""
    return name.endswith(SUFFIX) and not name.startswith(".")


def trace_paths(args: Sequence[str | Path]) -> list[Path]:
    """Expand what a user named (files, directories of *.gjtrace files, glob patterns) into
    trace files, each file once under the first name given for it."""
    out: dict[tuple[int, int] | Path, Path] = {}
    for arg in args:
        if not str(arg):  # Path("") is "."; an empty argument is a mistake, not this directory
            raise GpujitterError("an empty path was given")
        path = Path(arg)
        st = path_stat(path)
        if st is not None and stat.S_ISDIR(st.st_mode):
            try:  # (Path.glob says nothing of a directory it may not list)
                found = sorted(path / e.name for e in os.scandir(path) if _listed(e.name))
            except OSError as err:
                raise GpujitterError(f"cannot read {path}: {err.strerror}") from None
            if not found:
                raise GpujitterError(f"{path}: no *{SUFFIX} files in this directory")
        elif st is not None:
            out.setdefault((st.st_dev, st.st_ino), path)  # stat'ed already
            continue
        elif glob.has_magic(str(arg)):
            found = sorted(Path(p) for p in glob.glob(str(arg)))
            if not found:
                raise GpujitterError(f"{arg}: no file matches")
        else:
            raise GpujitterError(f"{path}: no such file or directory")
        for f in found:
            out.setdefault(file_identity(f), f)
    return list(out.values())


def file_identity(path: Path) -> tuple[int, int] | Path:
    """What makes two names one file (a link, `dir/../x`): its device and inode; the name
    where it cannot be stat'ed (the reader then says why)."""
    try:
        st = path.stat()
    except OSError:
        return path
    return st.st_dev, st.st_ino


def _one_timeline(headers: list[tuple[Path, TraceHeader]]) -> None:
    """Files read as one stream must be one node's, and each segment of a recording once:
    another host's events would land on this one's CPUs, GPUs and clock, and a segment read
    twice would count its gaps twice, both without a word."""
    nodes = sorted({(h.host, h.kernel) for _, h in headers})
    if len(nodes) > 1:  # host names repeat (cloud VMs); a kernel of its own is another node
        named = ", ".join(f"{host} ({kernel})" for host, kernel in nodes)
        raise GpujitterError(f"traces of {len(nodes)} nodes, {named}: read each on its own")
    seen: dict[tuple[str, int], Path] = {}
    for path, h in headers:
        if h.session and (h.session, h.segment) in seen:
            raise GpujitterError(
                f"{path} and {seen[h.session, h.segment]} are the same recording's segment "
                f"{h.segment}: read one of them"
            )
        seen[h.session, h.segment] = path


class TraceSet:
    """Several trace files read as one stream: a rotated recording, in recording order (each
    session's segments in their order, sessions by their first segment's wall time, from
    each header; file names do not matter). Only
    one file is open at a time. Damage is collected per file in `damage`. A file whose
    header cannot be read is left out, in `unreadable` (path, why), as long as another one
    can be: one damaged segment does not cost the others (none readable: its error).

    Each file's header takes the wall clock afresh: where it is not the clock the files
    before left in force (set while the daemon was stopped, or between a step and the tick
    that would have sent it), the stream gives it as a meta.clock before the file's events,
    as the daemon would have, and `began` names the file it began (for what says it)."""

    def __init__(self, args: Sequence[str | Path]) -> None:
        headers = []
        self.unreadable: list[tuple[Path, str]] = []
        paths = trace_paths(args)
        for path in paths:
            try:
                with TraceReader(path) as reader:
                    headers.append((path, reader.header))
            except GpujitterError as err:
                if len(paths) == 1:
                    raise
                self.unreadable.append((path, str(err)))
        if not headers:
            raise GpujitterError(self.unreadable[0][1])
        # A session's segments in their own order: each takes the wall clock afresh when
        # it starts, and a clock stepped meanwhile (NTP, by hand) would reorder them by it.
        # Sessions (daemon runs) by their first segment's wall time.
        first: dict[str, int] = {}
        for _, h in sorted(headers, key=lambda ph: ph[1].segment):
            first.setdefault(h.session, h.start_wall_ns)

        def order(ph: tuple[Path, TraceHeader]) -> tuple[int, str, int]:
            h = ph[1]
            # a file of no session has none to keep together: its own wall time
            return (first[h.session] if h.session else h.start_wall_ns, h.session, h.segment)

        headers.sort(key=order)
        self.paths = [p for p, _ in headers]
        self.headers = [h for _, h in headers]
        self.damage: list[str] = []
        self.began: dict[ClockRef, Path] = {}  # a header's clock given as a meta.clock: its file
        # the header clocks given that began another boot (its boot_id), for what says it
        self.rebooted: set[ClockRef] = set()
        self._read = 0  # bytes of the files read to their end
        self._reader: TraceReader | None = None

    def boots(self) -> list[TraceSet]:
        """Its files by the boot of the node they were written in (the header's `boot_id`:
        each boot's monotonic clock begins at zero), each boot's in their order, the boots
        in the order of their first file. A file of no boot id (a writer before format 1.1)
        goes with the file before it (the first: with the boot after it); the readers tell a
        restart among such files by their times. The files left out go with the first."""
        boots: dict[str, TraceSet] = {}
        key = ""
        for path, header in zip(self.paths, self.headers, strict=True):
            if header.boot_id and header.boot_id != key:
                if key == "" and "" in boots:  # the files of no id so far: of this boot
                    boots[header.boot_id] = boots.pop("")
                key = header.boot_id
            part = boots.setdefault(key, self._part())
            part.paths.append(path)
            part.headers.append(header)
        parts = list(boots.values())
        parts[0].unreadable = self.unreadable
        return parts

    def _part(self) -> TraceSet:
        """An empty set of some of its files (boots)."""
        part = object.__new__(TraceSet)
        part.unreadable, part.paths, part.headers, part.damage = [], [], [], []
        part.began, part.rebooted, part._read, part._reader = {}, set(), 0, None
        return part

    @property
    def boot_known(self) -> bool:
        """Whether each of its files names the boot it was written in."""
        return all(h.boot_id for h in self.headers)

    def position(self) -> int:
        """Bytes read so far, of all the files (for progress)."""
        return self._read + (self._reader.offset if self._reader else 0)

    def __iter__(self) -> Iterator[Event]:
        """Every file's events in turn; afterwards `damage` has each file's damage notes."""
        _one_timeline(list(zip(self.paths, self.headers, strict=True)))
        self.damage = [f"{why}; left out" for _, why in self.unreadable]
        self.began.clear()
        self._read = 0
        self.rebooted.clear()
        clock = self.headers[0].clock  # the latest reference read
        boot = self.headers[0].boot_id
        for path, header in zip(self.paths, self.headers, strict=True):
            with TraceReader(path) as reader:
                self._reader = reader
                # (a file of another boot: its clock is another timeline's)
                if boot and header.boot_id and header.boot_id != boot:
                    self.rebooted.add(header.clock)
                if stepped(clock, header.clock) or header.clock in self.rebooted:
                    self.began[header.clock] = path  # set since the files before were written
                    yield header.clock
                clock, boot = header.clock, header.boot_id or boot
                for ev in reader:
                    if type(ev) is ClockRef:
                        clock = ev
                    yield ev
                self.damage += reader.damage_notes()
                self._read += reader._size()
                self._reader = None
