"""Reading whole a file a user named: only a regular file (a FIFO would wait for a writer for
ever, a device such as /dev/zero never ends) and only up to a size past which it cannot be
what it was named as; every failure is one line naming the file."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from gpujitter.errors import GpujitterError


def open_regular(path: Path, what: str) -> BinaryIO:
    """Regular file `path` opened for reading; GpujitterError('<what> <path>: <why>') for
    anything else (a FIFO, a device), without waiting on it."""
    try:
        # Looked at before it is opened: an open, even one that does not wait, lets a FIFO's
        # writer in and may act on a device (a tape rewinds, a modem line rises).
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise GpujitterError(f"{what} {path}: not a regular file")
        # O_NONBLOCK: a FIFO put in its place since returns at once, to be refused below
        # (on a regular file the flag changes nothing)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise GpujitterError(f"{what} {path}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GpujitterError(f"{what} {path}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def mode_of(path: str | Path) -> int:
    """st_mode of what `path` names (links followed); 0 where nothing is; OSError where it
    cannot be looked at (a folder on the way this user may not search)."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return 0


def can_create(path: Path, what: str) -> None:
    """GpujitterError('<what> <path>: <why>') unless `path` could be created now: it does
    not exist and its folder exists and may be written. For an output made after long
    work (a drill's trace), so that a mistake in its name is said before the work."""
    folder = path.parent
    if os.path.isdir(path):
        raise GpujitterError(f"{what} {path}: is a directory")
    if os.path.lexists(path):
        raise GpujitterError(f"{what} {path} exists; remove it or choose another name")
    try:
        folder_mode = mode_of(folder)
    except OSError as err:  # a folder on the way this user may not search
        raise GpujitterError(f"{what} {path}: {err.strerror}") from None
    if not stat.S_ISDIR(folder_mode):
        raise GpujitterError(f"{what} {path}: no folder {folder}")
    if (why := _creates_no_file(folder)) is not None:
        raise GpujitterError(f"{what} {path}: folder {folder} takes no new file ({why})")


def _creates_no_file(folder: Path) -> str | None:
    """Why a file cannot be made in `folder`, or None. Tried, not judged from the mode:
    root passes every access() check, and /proc, /sys or a read-only mount refuse it
    anyway. An unnamed file first (O_TMPFILE: nothing to clean up); where the file system
    has none, a named one, removed at once."""
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600))
        return None
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return err.strerror
    probe = folder / f".gpujitter-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except OSError as err:
        return err.strerror
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def read_regular(path: Path, what: str, max_bytes: int, kind: str) -> bytes:
    """The bytes of regular file `path`, at most max_bytes; GpujitterError('<what> <path>:
    <why>') otherwise (`kind` names what a larger file is not: "not a configuration")."""
    with open_regular(path, what) as f:
        try:
            data = f.read(max_bytes + 1)  # it may grow after a stat: read, then judge
        except OSError as err:
            raise GpujitterError(f"{what} {path}: {err.strerror}") from None
    if len(data) > max_bytes:
        raise GpujitterError(f"{what} {path}: larger than {_size(max_bytes)}; {kind}")
    return data


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"
