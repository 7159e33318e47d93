"""Reading a TOML file a person wrote: any failure becomes one line naming the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from gpujitter.errors import GpujitterError
from gpujitter.files import read_regular

# Far past any configuration or topology override a person writes; a bigger file is a
# mistake (a path to data), and reading it whole could take the memory the unit allows.
MAX_TOML_BYTES = 1 << 20


def load_toml(path: Path, what: str) -> dict[str, Any]:
    """The parsed file; GpujitterError('<what> <path>: <why>') when unreadable or invalid."""
    try:
        text = read_regular(path, what, MAX_TOML_BYTES, "not a configuration").decode()
        return tomllib.loads(text)
    except UnicodeDecodeError:
        raise GpujitterError(f"{what} {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as err:
        raise GpujitterError(f"{what} {path}: {err}") from None
    except RecursionError:  # tomllib recurses per level of nested arrays and tables
        raise GpujitterError(f"{what} {path}: nested too deeply") from None
