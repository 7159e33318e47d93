"""The offline commands say how far they have read a long recording: one refreshed line on
standard error when it is a terminal, erased at the end, never on standard output."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from gpujitter.cli import main, progress
from gpujitter.daemon.sinks.trace import TraceReader, TraceWriter
from gpujitter.probes.events import to_record

SHOWN = re.compile(r"\rreading: (\d+)% of [\d.]+[KM]iB, (\d+) events\x1b\[K")


EXAMPLE = Path(__file__).parents[2] / "examples" / "h200-training.gjtrace"


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example trace as a rotated recording of two segments, and as an events file."""
    out = tmp_path_factory.mktemp("recordings")
    with TraceReader(EXAMPLE) as reader:
        first, events = reader.header, list(reader)
    rotated = out / "rotated"
    rotated.mkdir()
    half = len(events) // 2
    for segment, part in enumerate([events[:half], events[half:]]):
        with TraceWriter(rotated / f"{segment}.gjtrace", replace(first, segment=segment)) as w:
            for ev in part:
                w.write(ev)
    saved = out / "events.ndjson"
    saved.write_bytes(b"".join(orjson.dumps(to_record(e)) + b"\n" for e in [first.clock, *events]))
    return {"trace": rotated, "events": saved}


def every_event(monkeypatch: pytest.MonkeyPatch, terminal: bool = True) -> None:
    """The clock read, and the line refreshed, at every event; standard error a terminal
    (patched in the test itself: capsys's stream in a fixture is not the test's)."""
    monkeypatch.setattr(progress, "CHECK_EVERY", 1)
    monkeypatch.setattr(progress, "REFRESH_S", 0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)


COMMANDS = {
    "report": ["report", "--json"],
    "export": ["export", "-o", "{tmp}/out.json", "--json"],
    "trace": ["trace", "--json"],
    "gaps": ["gaps", "--json", "--replay-events"],
}


@pytest.mark.parametrize("kind", ["trace", "events"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_terminal_is_told_how_far_the_reading_is(
    recordings: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], command: str, kind: str,
) -> None:  # fmt: skip
    every_event(monkeypatch)
    args = [a.format(tmp=tmp_path) for a in COMMANDS[command]]
    if command == "gaps" and kind == "trace":  # one file: the first segment
        assert main([*args, str(recordings["trace"] / "0.gjtrace")]) == 0
    else:
        assert main([*args, str(recordings[kind])]) == 0
    out, err = capsys.readouterr()
    if command == "gaps":
        assert [json.loads(line) for line in out.splitlines()]  # NDJSON, nothing between
    else:
        json.loads(out)  # standard output holds the JSON alone
    shown = SHOWN.findall(err)
    assert shown, repr(err)
    shares = [int(share) for share, _ in shown]
    assert shares == sorted(shares) and shares[-1] == 100
    assert [int(n) for _, n in shown] == list(range(1, len(shown) + 1))
    assert err.endswith("\r\x1b[K")  # erased: what follows starts on a clean line


def test_no_terminal_no_progress(
    recordings: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    every_event(monkeypatch, terminal=False)
    assert main(["report", str(recordings["trace"])]) == 0
    assert "reading:" not in capsys.readouterr().err


def test_gaps_printed_to_the_terminal_are_not_interleaved_with_progress(
    recordings: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    every_event(monkeypatch)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["gaps", "--replay-events", str(recordings["events"])]) == 0
    out, err = capsys.readouterr()
    assert "GPU 0" in out and "reading:" not in err
