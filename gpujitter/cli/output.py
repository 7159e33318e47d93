"""Printing results: JSON documents and NDJSON streams through orjson, aligned text tables.
Both are safe on a terminal whatever names the node holds: JSON escapes every non-printable
character, a table shows each cell through gpujitter.text.printable."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import orjson

from gpujitter.errors import GpujitterError
from gpujitter.text import dumps, inert_json, printable

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def print_json(obj: Any, stream: TextIO | None = None) -> None:
    """One indented JSON document (results of one-shot commands), on standard output unless
    another stream is named."""
    stream = stream or sys.stdout
    stream.flush()  # what was printed before comes first
    stream.buffer.write(json_bytes(obj) + b"\n")
    stream.flush()


def json_bytes(obj: Any, depth: int = 0) -> bytes:
    """`obj` as print_json writes it (indented, inert, no newline after it), as it sits
    `depth` levels deep in a document: every line after its first indented 2 * depth more
    (JSON strings hold no raw newline). A document written in pieces (`report --json`)
    writes the same bytes as the whole: inert_json replaces single characters."""
    data = inert_json(_dumps(obj, _OPTS | orjson.OPT_INDENT_2))
    return data.replace(b"\n", b"\n" + b"  " * depth) if depth else data


def print_ndjson(obj: Any) -> None:
    """One line of an NDJSON stream (live commands); flushed so pipes see it at once."""
    sys.stdout.buffer.write(inert_json(_dumps(obj, _OPTS)) + b"\n")
    sys.stdout.flush()


def _dumps(obj: Any, option: int) -> bytes:
    # gpujitter.text.dumps writes what orjson refuses (a str of undecodable bytes, an integer
    # past 64 bits) as text; what is left is nesting past orjson's 254 levels, which only
    # data from elsewhere has (a daemon's snapshot read with a reader that takes 1024).
    try:
        return dumps(obj, option)
    except (TypeError, RecursionError) as err:
        raise GpujitterError(f"cannot be written as JSON: {err}") from None


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is never padded."""
    cells = [[str(h) for h in headers]]
    cells += [["" if c is None else printable(str(c)) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)
