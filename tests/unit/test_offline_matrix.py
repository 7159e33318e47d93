"""Every offline command (`report`, `trace`, `top --replay`, `gaps --replay-events`) reads every
format gpujitter writes — a trace, a rotated trace directory, a `gaps --save-events` file, an
attribution log, `run --json`'s output — each written by the daemon's own sinks on one run of
the runtime, and says in one line what it is reading when that is not a trace."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpujitter.cli import build_parser, load_commands, main
from gpujitter.cli.gaps import SavedEvents
from gpujitter.cli.top import make_feed
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.service.runtime import ListSource, Runtime
from gpujitter.daemon.service.service import Console
from gpujitter.daemon.sinks.adapters import CaptureSink, ConsoleSink, LogSink
from gpujitter.daemon.sinks.capture import TraceCapture
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.rotation import Rotation
from gpujitter.daemon.sinks.trace import TraceReader
from gpujitter.probes.events import ClockRef
from gpujitter.tui.feeds.replay import GAP_KINDS, ReplayFeed
from gpujitter.tui.inbox import ReplayPosition

EXAMPLE = Path(__file__).parents[2] / "examples" / "h200-training.gjtrace"
FORMATS = ("trace", "rotated", "events", "log", "printed")
# What each says it reads (the first line of `report`, `gaps`' stderr, top's title bar).
SAYS = {
    "events": "an events file (gaps --save-events)",
    "log": "an attribution log (attributions as logged, not re-analysed)",
    "printed": "attributions as `gpujitter run --json` printed them (not re-analysed)",
}
ANALYSED = ("log", "printed")  # attributions already made: not replayed


class LiveConsole(ConsoleSink):
    """The console of a live run, whose lines carry their wall `time` (a replay's runtime has
    no clock of this node to give them)."""

    def __init__(self, console: Console, clock: ClockRef) -> None:
        super().__init__(console)
        self.clock = clock

    def started(self, runtime: Runtime) -> None:
        self.console.clock = self.clock


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example trace's events through the runtime as the daemon runs it, with its
    trace capture (one file; a rotated directory), its attribution log, its console with
    `--json` (with the wall clock a live run has) and the `gaps --save-events` writer as
    sinks. A rotation takes the wall clock afresh: the recording's, as it would have been
    on its node (this machine's is another timeline, which the readers follow)."""
    out = tmp_path_factory.mktemp("written")
    with TraceReader(EXAMPLE) as reader:
        header = reader.header
        events = list(reader)
    paths = {
        "trace": out / "one.gjtrace",
        "rotated": out / "rotated",
        "events": out / "events.ndjson",
        "log": out / "attributions.jsonl",
        "printed": out / "run-json.ndjson",
    }
    printed = paths["printed"].open("w")
    console = Console(printed, as_json=True)
    sinks = [
        CaptureSink(TraceCapture(paths["trace"], header)),
        CaptureSink(TraceCapture(paths["rotated"], header, Rotation(max_bytes=800_000))),
        SavedEvents(paths["events"], header.clock),
        LogSink(JsonLog(paths["log"])),
        LiveConsole(console, header.clock),
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpujitter.daemon.sinks.capture.clock_ref", lambda: header.clock)
        Runtime(
            ListSource(events), header.topology, sinks=sinks, signals=False,
            analysis=lambda _: AnalysisConfig.from_record(header.analysis),
        ).run()  # fmt: skip
    console.close(timeout_s=10)
    printed.close()
    assert b'{"time":' in paths["printed"].read_bytes()[:10]
    assert len(list(paths["rotated"].iterdir())) == 3
    return paths


@pytest.fixture(scope="module")
def from_the_trace() -> dict[str, list[Any]]:
    """What each command found in the one-file trace (read once)."""
    return {}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """A command's standard output and error (its JSON writers write bytes: a real buffer)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
        out.flush()
    return out.buffer.getvalue().decode(), capsys.readouterr().err  # type: ignore[attr-defined]


def report(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[tuple[int, int]]]:
    text, _ = _run(["report", str(path)], capsys)
    got = json.loads(_run(["report", "--json", str(path)], capsys)[0])
    return text.splitlines()[0], [(a["ts_ns"], a["end_ns"]) for a in got["attributions"]]


def trace(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[tuple[str, int]]]:
    """(the first line, the events per kind: a trace's files summed, the wall clock that
    begins an events file left out)."""
    text, _ = _run(["trace", str(path)], capsys)
    got = json.loads(_run(["trace", "--json", str(path)], capsys)[0])
    assert got.get("damaged", 0) == 0 and got.get("damage", []) == []
    kinds = sorted((k, n) for k, n in got["kinds"].items() if k != "meta.clock")
    return text.splitlines()[0], kinds


def gaps(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[tuple[int, int]]]:
    _, said = _run(["gaps", "--replay-events", str(path)], capsys)
    printed = _run(["gaps", "--replay-events", str(path), "--json"], capsys)[0]
    return said.splitlines()[0] if said else "", [
        (r["ts_ns"], r["end_ns"]) for r in map(json.loads, printed.splitlines())
    ]


class Played:
    """The app's side of a replay (a Receiver): the gaps and attributions it was handed."""

    def __init__(self) -> None:
        self.got: list[dict] = []
        self.done = False

    def records(self, records: object) -> None:
        self.got += [r for r in records if r["type"] in GAP_KINDS]  # type: ignore[attr-defined]

    def reset(self) -> None:
        self.got = []

    def connection(self, state: str, detail: str = "") -> None:
        pass

    def position(self, pos: ReplayPosition, selected_gap: str | None = None) -> None:
        self.done = pos.done


def top(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[tuple[int, int]]]:
    args = build_parser(load_commands()).parse_args(["top", "--replay", str(path), "--at", "end"])
    feed = make_feed(args)
    assert isinstance(feed, ReplayFeed)
    app = Played()
    feed.run(app, lambda: app.done)
    attributed = [(r["ts_ns"], r["end_ns"]) for r in app.got if r["type"] == "gpu.attribution"]
    return feed.label, attributed


COMMANDS: dict[str, Callable[[Path, pytest.CaptureFixture[str]], tuple[str, list[Any]]]] = {
    "report": report,
    "trace": trace,
    "top --replay": top,
    "gaps --replay-events": gaps,
}


@pytest.mark.parametrize("kind", FORMATS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_every_format(
    written: dict[str, Path],
    from_the_trace: dict[str, list[Any]],
    command: str,
    kind: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    said, found = COMMANDS[command](written[kind], capsys)
    if command not in from_the_trace:
        from_the_trace[command] = COMMANDS[command](written["trace"], capsys)[1]
    want = from_the_trace[command]
    if kind in SAYS:
        assert SAYS[kind] in said, said
    else:
        assert not any(what in said for what in SAYS.values()), said
    if command == "gaps --replay-events" and kind in ANALYSED:
        # The log holds the attributed gaps only: each of them is among the detector's.
        assert set(found) <= set(want) and found
    elif command == "trace" and kind in ANALYSED:
        assert found == [("gpu.attribution", len(report(written["trace"], capsys)[1]))]
    else:
        assert found == want
