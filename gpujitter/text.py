"""Text that came from other processes (comm, file names, IRQ and cgroup names, command lines),
made lossless when decoded and inert when shown: the one rule every probe, command and view uses.

Any local user chooses its process's name (up to 15 bytes, anything but NUL), so such text may
hold terminal control sequences, bidi overrides and bytes that are not UTF-8. Two steps:
`decode_name` turns kernel bytes into a str that keeps every byte (what events, traces and
JSON carry); `printable` turns any str into one that a terminal shows as typed (what text
output and the TUI show). Both are injective, so distinct names never read the same.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar

import orjson

T = TypeVar("T")


def decode_name(raw: bytes) -> str:
    """Kernel bytes (a NUL-terminated char array, or a /proc file's bytes) as text, losslessly:
    UTF-8, each byte that is not part of valid UTF-8 written `\\xNN`, and a backslash written
    `\\\\` (so that a name that really reads `\\xff` differs from one holding byte 0xff)."""
    raw = raw.split(b"\0", 1)[0]
    if raw.isascii() and b"\\" not in raw:
        return raw.decode("ascii")
    return raw.replace(b"\\", b"\\\\").decode("utf-8", errors="backslashreplace")


def _escape(ch: str) -> str:
    code = ord(ch)
    # ASCII as \xNN, the rest as \uNNNN or \UNNNNNNNN: decode_name's \xNN are bytes >= 0x80,
    # so a C1 control (U+009B, bytes c2 9b) never reads like the lone byte 0x9b.
    if code < 0x80:
        return f"\\x{code:02x}"
    if code in _FSDECODED_BYTES:  # the byte, as decode_name writes it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# os.fsdecode (file names, arguments, the environment) keeps each byte that is not UTF-8
# (0x80 to 0xff) as a lone surrogate: U+DC00 + the byte.
_FSDECODED_BYTES = range(0xDC80, 0xDD00)


def printable(text: str) -> str:
    """`text` with every character a terminal would act on or hide written as an escape:
    C0 and C1 controls, DEL, format characters (bidi overrides, zero-width ones), line and
    paragraph separators, spaces other than ' ', surrogates, private-use and unassigned code
    points (all that str.isprintable() refuses); os.fsdecode's stand-in for a byte that is
    not UTF-8 as that byte, `\\xff`. Idempotent; the rest is kept as it is."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def quoted(value: object, limit: int = 80) -> str:
    """`value` as an error line quotes what someone typed: its repr, printable, cut after
    `limit` characters (a pasted blob must not turn one line into a page); a byte that is
    not UTF-8 as printable writes it (repr's `\\udcff` is `\\xff`)."""
    text = _REPR_STAND_IN.sub(_stand_in_as_byte, repr(value))
    return printable(text if len(text) <= limit else text[:limit] + "...")


# In a repr: an escaped backslash (kept: what follows it is text), or os.fsdecode's stand-in
# for a byte (_FSDECODED_BYTES).
_REPR_STAND_IN = re.compile(r"\\(\\|udc[89a-f][0-9a-f])")


def _stand_in_as_byte(m: re.Match[str]) -> str:
    escaped = m.group(1)
    return m.group() if escaped == "\\" else f"\\x{escaped[3:]}"


_NON_ASCII = re.compile("[^\x00-\x7e]")


def _json_escape(m: re.Match[str]) -> str:
    ch = m.group()
    if ch.isprintable():
        return ch
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    high, low = divmod(code - 0x10000, 0x400)
    return f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}"


def inert_json(data: bytes) -> bytes:
    """orjson's output with the non-printable characters it leaves raw (DEL, C1 controls,
    bidi overrides, line separators...) written as JSON \\u escapes: the same JSON value,
    safe to print on a terminal. orjson already escapes the C0 controls."""
    if data.isascii() and b"\x7f" not in data:
        return data
    return _NON_ASCII.sub(_json_escape, data.decode("utf-8")).encode("utf-8")


def inert_record(value: T) -> T:
    """A record (frozen dataclasses, tuples) with every string in it made printable: for a
    view that shows records received from elsewhere field by field."""
    return _inert(value)


def _inert(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, tuple):
        return tuple(_inert(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _inert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    return value


def jsonable(obj: Any) -> Any:
    """`obj` with what orjson refuses made writable: a str holding surrogates (a file name
    or argument of bytes that are not UTF-8, as os.fsdecode reads it) as decode_name writes
    those bytes (`\\xff`), an integer past 64 bits as its decimal string; dataclasses as
    dicts, tuples as lists; the rest as it is."""
    if isinstance(obj, str):
        try:
            obj.encode()
            return obj
        except UnicodeEncodeError:
            try:  # os.fsdecode's surrogates: the bytes they stand for
                raw = obj.encode(errors="surrogateescape")
            except UnicodeEncodeError:  # any other lone surrogate
                raw = obj.encode(errors="backslashreplace")
            return decode_name(raw)
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**64:
        return str(obj)
    if isinstance(obj, dict):
        return {jsonable(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


def dumps(obj: Any, option: int = 0) -> bytes:
    """orjson.dumps, and where orjson refuses a value (jsonable's kinds: a name of bytes that
    are not UTF-8 reached a record), the same record written as jsonable makes it: what the
    daemon's sinks write never raises for what another process chose to name its files."""
    try:
        return orjson.dumps(obj, option=option)
    except TypeError:
        return orjson.dumps(jsonable(obj), option=option)
