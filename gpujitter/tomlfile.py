"""Reading a TOML file a person wrote: any failure becomes one line naming the file."""

from __future__ import annotations

import codecs
import re
import tomllib
from pathlib import Path
from typing import Any

from gpujitter.errors import GpujitterError
from gpujitter.files import read_regular
from gpujitter.text import printable

# Far past any configuration or topology override a person writes; a bigger file is a
# mistake (a path to data), and reading it whole could take the memory the unit allows.
MAX_TOML_BYTES = 1 << 20
_AT_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_SHOWN_CHARS = 80  # of the line an error points at


def load_toml(path: Path, what: str) -> dict[str, Any]:
    """The parsed file; GpujitterError('<what> <path>: <why>') when unreadable or invalid."""
    try:
        # Editors on some systems begin UTF-8 with a byte-order mark, which TOML does not.
        data = read_regular(path, what, MAX_TOML_BYTES, "not a configuration")
        text = data.removeprefix(codecs.BOM_UTF8).decode()
        return tomllib.loads(text)
    except UnicodeDecodeError:
        raise GpujitterError(f"{what} {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as err:
        raise GpujitterError(f"{what} {path}: {err}{_line_at(text, str(err))}") from None
    except RecursionError:  # tomllib recurses per level of nested arrays and tables
        raise GpujitterError(f"{what} {path}: nested too deeply") from None
    except ValueError:  # an integer past Python's digit limit for int(str)
        raise GpujitterError(f"{what} {path}: a number too long to read") from None


def _line_at(text: str, message: str) -> str:
    """The line a parse error points at, so that the error names the key ("Cannot overwrite
    a value" says neither which key nor that it was given twice)."""
    m = _AT_LINE.search(message)
    lines = text.splitlines()
    if m is None or not 0 < int(m.group(1)) <= len(lines):
        return ""
    line = lines[int(m.group(1)) - 1].strip()
    if len(line) > _SHOWN_CHARS:
        line = line[:_SHOWN_CHARS] + "..."
    return f": {printable(line)}" if line else ""
