"""Reading a TOML file a person wrote: any failure becomes one line naming the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from gpujitter.errors import GpujitterError


def load_toml(path: Path, what: str) -> dict[str, Any]:
    """The parsed file; GpujitterError('<what> <path>: <why>') when unreadable or invalid."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as err:
        raise GpujitterError(f"{what} {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise GpujitterError(f"{what} {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as err:
        raise GpujitterError(f"{what} {path}: {err}") from None
    except RecursionError:  # tomllib recurses per level of nested arrays and tables
        raise GpujitterError(f"{what} {path}: nested too deeply") from None
