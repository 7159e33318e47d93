"""Reading a TOML file a person wrote: any failure becomes one line naming the file."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from gpujitter.errors import GpujitterError

# Far past any configuration or topology override a person writes; a bigger file is a
# mistake (a path to data), and reading it whole could take the memory the unit allows.
MAX_TOML_BYTES = 1 << 20


def load_toml(path: Path, what: str) -> dict[str, Any]:
    """The parsed file; GpujitterError('<what> <path>: <why>') when unreadable or invalid."""
    try:
        text = _read(path, what).decode()
        return tomllib.loads(text)
    except OSError as err:
        raise GpujitterError(f"{what} {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise GpujitterError(f"{what} {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as err:
        raise GpujitterError(f"{what} {path}: {err}") from None
    except RecursionError:  # tomllib recurses per level of nested arrays and tables
        raise GpujitterError(f"{what} {path}: nested too deeply") from None


def _read(path: Path, what: str) -> bytes:
    """At most MAX_TOML_BYTES of a regular file. O_NONBLOCK: opening a FIFO would otherwise
    wait for a writer for ever; a device (/dev/zero) never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GpujitterError(f"{what} {path}: not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_TOML_BYTES + 1)  # it may grow after a stat: read, then judge
    finally:
        os.close(fd)
    if len(data) > MAX_TOML_BYTES:
        raise GpujitterError(f"{what} {path}: larger than 1 MiB; not a configuration")
    return data
