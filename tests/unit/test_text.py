"""Names from other processes: decoded without loss, shown without control characters, and
two different names never read the same (gpujitter/text.py)."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import orjson

from gpujitter.text import decode_name, dumps, inert_json, printable, quoted

# What a hostile process may call itself: a terminal title (OSC ... BEL), CSI sequences,
# the 8-bit CSI, a bidi override, Textual markup, and bytes that are not UTF-8.
HOSTILE = [
    b"\x1b]0;pwned\x07",
    b"\x1b[2J\x1b[31mred",
    "\x9b31m".encode(),
    "evil\u202etxt.sh".encode(),
    b"[bold red]x[/]",
    b"ab\xff",
    b"ab\xfe",
    b"line\nbreak\ttab\r",
    b"\x7fdel",
]


def unprintable(text: str) -> list[str]:
    return [ch for ch in text if not ch.isprintable()]


def from_shown(text: str) -> bytes:
    """The bytes a name had, read back from printable(decode_name(raw)): the oracle that
    proves nothing was lost (and hence that different names stay different)."""
    out = bytearray()
    pos = 0
    escape = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")
    while pos < len(text):
        m = escape.match(text, pos)
        if m is None:
            out += text[pos].encode()
            pos += 1
            continue
        body = m.group(1)
        if body == "\\":
            out += b"\\"
        elif body[0] == "x" and int(body[1:], 16) >= 0x80:  # a byte that was not UTF-8
            out.append(int(body[1:], 16))
        else:  # a character escaped for the terminal
            out += chr(int(body[1:], 16)).encode()
        pos = m.end()
    return bytes(out)


def test_hostile_names_show_no_control_characters_and_stay_readable() -> None:
    shown = {raw: printable(decode_name(raw)) for raw in HOSTILE}
    for raw, text in shown.items():
        assert unprintable(text) == [], (raw, text)
        assert from_shown(text) == raw
    assert shown[b"\x1b]0;pwned\x07"] == "\\x1b]0;pwned\\x07"
    assert shown["\x9b31m".encode()] == "\\u009b31m"
    assert shown["evil\u202etxt.sh".encode()] == "evil\\u202etxt.sh"
    assert shown[b"[bold red]x[/]"] == "[bold red]x[/]"  # markup is the TUI's to neutralise
    assert shown[b"line\nbreak\ttab\r"] == "line\\x0abreak\\x09tab\\x0d"


def test_invalid_utf8_keeps_each_byte_so_names_stay_distinct() -> None:
    # Decoding with errors="replace" made both of these "ab\ufffd".
    assert decode_name(b"ab\xff") == "ab\\xff"
    assert decode_name(b"ab\xff") != decode_name(b"ab\xfe")
    # A name that really holds the four characters \xff is not the byte 0xff.
    assert decode_name(b"ab\\xff") == "ab\\\\xff" != decode_name(b"ab\xff")
    # The C1 control U+009B (bytes c2 9b) and the lone byte 0x9b differ on screen too.
    assert printable(decode_name("\x9b".encode())) != printable(decode_name(b"\x9b"))
    assert decode_name(b"python3\0garbage") == "python3"
    assert decode_name("naïve".encode()) == "naïve"


def test_printable_is_idempotent_and_leaves_ordinary_text_alone() -> None:
    for text in ("python3", "kworker/3:1-events", "pt_data_worker", "naïve 数据"):
        assert printable(text) == text
    for raw in HOSTILE:
        once = printable(decode_name(raw))
        assert printable(once) == once


def test_a_byte_of_a_file_name_that_is_not_utf8_reads_as_decode_name_writes_it() -> None:
    """os.fsdecode keeps such a byte as a lone surrogate (U+DCFF for 0xff), which printable
    and quoted wrote `\\udcff`: a file name read one way in a message, another in JSON."""
    name = os.fsdecode(b"o\xff\x80.json")
    assert printable(name) == "o\\xff\\x80.json" == printable(decode_name(b"o\xff\x80.json"))
    assert quoted(name) == "'o\\xff\\x80.json'"
    assert quoted([os.fsdecode(b"\xff")]) == "['\\xff']"
    # text that reads \udcff, and lone surrogates of other origins, stay as they are
    assert quoted("\\udcff") == "'\\\\udcff'"
    assert printable("\udc7f\ud800") == "\\udc7f\\ud800"


def test_fuzz_random_comms_never_show_a_control_character_and_never_collide() -> None:
    rng = random.Random(20260301)
    alphabet = [*range(256)]
    weights = [8 if b in (0x1B, 0x5C, 0x9B, 0xC2, 0xE2, 0x80, 0xAE) else 1 for b in alphabet]
    seen: dict[str, bytes] = {}
    for _ in range(20_000):
        raw = bytes(rng.choices(alphabet, weights, k=rng.randint(0, 15))).split(b"\0")[0]
        shown = printable(decode_name(raw))
        assert unprintable(shown) == [], raw
        assert from_shown(shown) == raw
        assert seen.setdefault(shown, raw) == raw  # distinct names, distinct text
        # What JSON carries is valid UTF-8 and comes back as the same string.
        record = orjson.dumps({"comm": decode_name(raw)})
        assert orjson.loads(record)["comm"] == decode_name(raw)


def test_json_output_escapes_what_orjson_leaves_raw_and_keeps_the_value() -> None:
    value = {"comm": "a\x1b]0;t\x07 \x7f \x9b \u202e \u2028 \U000e0041 é 数", "n": 1}
    data = inert_json(orjson.dumps(value))
    assert data.isascii() is False  # printable non-ASCII stays as it is (é, 数)
    text = data.decode()
    assert unprintable(text) == []
    assert "\\u009b" in text and "\\u202e" in text and "\\udb40\\udc41" in text
    assert orjson.loads(data) == value
    plain = orjson.dumps({"comm": "python3"})
    assert inert_json(plain) is plain


def test_a_file_name_of_bytes_that_are_not_utf8_reaches_every_sink_written_as_its_bytes(
    tmp_path: Path,
) -> None:
    """Mapped-file paths are read as os.fsdecode reads names (surrogates for such bytes), so
    that they open what they name; orjson refuses such a str, and a module path in a stack
    sample or a library path in a probe's status raised out of the log, the stream and the
    capture: the daemon exited, and under systemd restarted into the same exit."""
    from gpujitter.daemon.sinks.jsonlog import JsonLog, JsonLogReader
    from gpujitter.daemon.sinks.stream import _line
    from gpujitter.daemon.sinks.trace import encode
    from gpujitter.probes.events import ProbeStatus, PySample, to_json, to_record

    path = os.fsdecode(b"/opt/caf\xe9/libfoo.so")
    sample = PySample(ts_ns=1, tid=2, tgid=2, func="f", file=path, line=0)
    status = ProbeStatus(ts_ns=1, probe="cuda", state="degraded", reason=f"{path}: no symbols")
    written = "/opt/caf\\xe9/libfoo.so"  # decode_name's form of those bytes
    assert orjson.loads(to_json(sample))["file"] == written
    assert encode(sample)  # the capture's frame
    assert orjson.loads(_line(to_record(status)))["reason"] == f"{written}: no symbols"
    assert orjson.loads(dumps({"n": 2**70, "p": [path]})) == {"n": str(2**70), "p": [written]}
    with JsonLog(tmp_path / "a.jsonl") as log:
        assert log.write(sample) and log.write({"type": "x", "path": path})
    assert [r.get("file", r.get("path")) for r in JsonLogReader(tmp_path / "a.jsonl")] == [
        written,
        written,
    ]


def test_a_comm_decoded_again_is_the_same_string_and_the_cache_stays_bounded() -> None:
    # The engine keeps a minute of events, each naming its task: one string per name, not
    # one per event (138k copies beside a job churning threads).
    from gpujitter.probes import base

    raw = b"pt_data_worker\0\0"
    first = base.comm_str(raw)
    again = bytes(bytearray(raw))  # equal bytes, another object (as each event's are)
    assert first == "pt_data_worker" and again is not raw and base.comm_str(again) is first
    assert base.comm_str(b"pt_data_worke\xff\0") == "pt_data_worke\\xff"  # one byte apart
    for n in range(base._NAMES_MAX + 10):  # a crowd of distinct names
        assert base.comm_str(f"t{n}".encode()) == f"t{n}"
    assert len(base._NAMES) <= base._NAMES_MAX
