"""Reading whole a file a user named: only a regular file (a FIFO would wait for a writer for
ever, a device such as /dev/zero never ends) and only up to a size past which it cannot be
what it was named as; every failure is one line naming the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpujitter.errors import GpujitterError


def read_regular(path: Path, what: str, max_bytes: int, kind: str) -> bytes:
    """The bytes of regular file `path`, at most max_bytes; GpujitterError('<what> <path>:
    <why>') otherwise (`kind` names what a larger file is not: "not a configuration")."""
    try:
        # O_NONBLOCK: a FIFO's open returns at once, to be refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise GpujitterError(f"{what} {path}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GpujitterError(f"{what} {path}: not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)  # it may grow after a stat: read, then judge
    except OSError as err:
        raise GpujitterError(f"{what} {path}: {err.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise GpujitterError(f"{what} {path}: larger than {_size(max_bytes)}; {kind}")
    return data


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"
