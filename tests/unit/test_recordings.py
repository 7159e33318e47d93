"""Every offline command reads every recording gpujitter writes — a trace, an events file
(`gaps --save-events`), an attribution log — told apart by content, and says what it read;
anything else is one line and exit 2 (tests/unit/test_offline_matrix.py: each command on
each format the daemon's sinks write)."""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import io
import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpujitter.cli import main
from gpujitter.daemon.offline.recordings import EVENTS, LOG, TRACE, open_recording, sniff
from gpujitter.daemon.sinks.jsonlog import JsonLog, rotated_files
from gpujitter.daemon.sinks.trace import TraceReader, TraceWriter, trace_paths
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import wall_ns
from gpujitter.probes.events import ClockRef, Event, to_record
from tests.unit.forked import as_nobody, in_child

EXAMPLE = Path(__file__).parents[2] / "examples" / "h200-training.gjtrace"
HOUR = 3_600_000_000_000


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example trace, its events as `gaps --save-events` writes them (wall clock first),
    and the attribution log `run --log` wrote of it."""
    out = tmp_path_factory.mktemp("formats")
    with TraceReader(EXAMPLE) as reader:
        clock = reader.header.clock
        events = list(reader)
    (out / "events.ndjson").write_bytes(
        b"".join(orjson.dumps(to_record(e)) + b"\n" for e in [clock, *events])
    )
    with JsonLog(out / "attributions.jsonl") as log:
        for rec in _run_json(["report", "--json", str(EXAMPLE)])["attributions"]:
            log.write(rec)
    return {TRACE: EXAMPLE, EVENTS: out / "events.ndjson", LOG: out / "attributions.jsonl"}


def _run(argv: list[str]) -> str:
    """A command's standard output (its JSON writers write bytes, so a real buffer)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
        out.flush()
    return out.buffer.getvalue().decode()  # type: ignore[attr-defined]


def _run_json(argv: list[str]) -> dict:
    return json.loads(_run(argv))


def test_a_log_whose_lines_carry_their_time_reads_by_the_wall_clock(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's log lines carry `time`: a report of the log gives the trace's wall times
    and takes wall times for --from; a clock set during the run (an hour on, from the
    third line) moves the times of the lines after it, and only those."""
    with TraceReader(EXAMPLE) as reader:
        clock = reader.header.clock
    logged = [json.loads(line) for line in formats[LOG].read_text().splitlines()]
    for name, step_at in (("timed.jsonl", None), ("stepped.jsonl", 2)):
        with JsonLog(tmp_path / name) as log:
            log.clock = clock
            for n, line in enumerate(logged):
                if n == step_at:
                    log.clock = ClockRef(ts_ns=clock.ts_ns, realtime_ns=clock.realtime_ns + HOUR)
                log.write({k: v for k, v in line.items() if k != "schema"})
    assert open_recording([tmp_path / "timed.jsonl"]).wall_clock
    assert main(["report", str(formats[TRACE])]) == 0
    want = longest_lines(capsys.readouterr().out)
    assert main(["report", str(tmp_path / "timed.jsonl")]) == 0
    assert longest_lines(capsys.readouterr().out) == want
    assert main(["report", "--from", "12:01:50", str(tmp_path / "timed.jsonl")]) == 0
    capsys.readouterr()
    # what the log holds: its lines' records, the clock read from them no record of it
    held = _run_json(["trace", "--json", str(tmp_path / "timed.jsonl")])
    assert held["kinds"] == {"gpu.attribution": len(logged)}
    events = list(open_recording([tmp_path / "stepped.jsonl"]))
    clocks = [e for e in events if isinstance(e, ClockRef)]
    offsets = [c.realtime_ns - c.ts_ns for c in clocks]  # to the µs that `time` keeps
    start = clock.realtime_ns - clock.ts_ns
    assert len(offsets) == 2 and abs(offsets[0] - start) < 1000
    assert abs(offsets[1] - start - HOUR) < 1000
    assert events.index(clocks[1]) == 3  # before the third line's record, after two


def longest_lines(report: str) -> list[str]:
    return [line for line in report.splitlines() if " idle " in line and " at " in line]


def stepped(formats: dict[str, Path], tmp_path: Path, kind: str) -> Path:
    """The events file or the log of the example with the wall clock set an hour on half-way
    (12:02:01 of the recording), as the daemon records it: a meta.clock in the events, a
    `time` an hour on in the log's lines from there."""
    with TraceReader(EXAMPLE) as reader:
        clock = reader.header.clock
    lines = formats[EVENTS].read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    at = orjson.loads(lines[half - 1])["ts_ns"]
    step = ClockRef(ts_ns=at, realtime_ns=wall_ns(clock, at) + HOUR)
    path = tmp_path / f"stepped.{kind}"
    if kind == EVENTS:
        path.write_bytes(b"".join([*lines[:half], orjson.dumps(to_record(step)) + b"\n",
                                   *lines[half:]]))  # fmt: skip
        return path
    with JsonLog(path) as log:
        for line in map(json.loads, formats[LOG].read_text().splitlines()):
            log.clock = step if line["ts_ns"] >= at else clock
            log.write({k: v for k, v in line.items() if k != "schema"})
    return path


@pytest.mark.parametrize("kind", [EVENTS, LOG])
def test_a_clock_set_during_the_recording_is_said_where_its_times_are_shown(
    formats: dict[str, Path], tmp_path: Path, kind: str, utc: None,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A second reference (the daemon's meta.clock when the wall clock was set, a log line's
    `time` an hour on) moved the times of every gap after it an hour on, without a word: it
    is the node's clock, honoured, and said wherever times are shown, by how much and when."""
    path = stepped(formats, tmp_path, kind)
    note = "clock: the wall clock was set +3600.000 s during the recording, at 2026-12-01 12:0"
    assert main(["report", "--top", "100", str(path)]) == 0
    out = capsys.readouterr().out
    (said,) = [line for line in out.splitlines() if line.startswith("clock: ")]
    assert said.startswith(note) and said.endswith("by the new clock")
    hours = Counter(line.split(" at ")[1][:2] for line in longest_lines(out))
    assert hours["12"] and hours["13"] and hours["12"] + hours["13"] == 32
    page = tmp_path / "report.html"
    assert main(["report", str(path), "--html", str(page)]) == 0
    assert note in page.read_text()
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"  {note}" in out and " .. 13:02:" in out  # the last event by the clock of then
    assert main(["gaps", "--replay-events", str(path)]) == 0
    assert f"# {note}" in capsys.readouterr().err
    # a clock that was not set is said by no command (an events file repeats its first)
    for argv in (["report"], ["trace"], ["gaps", "--replay-events"]):
        assert main([*argv, str(formats[EVENTS])]) == 0
        assert "clock: " not in "".join(capsys.readouterr())


@pytest.mark.parametrize("kind", [EVENTS, LOG])
def test_from_and_to_take_the_clock_each_gap_is_printed_by(
    formats: dict[str, Path], tmp_path: Path, kind: str, utc: None,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """--from/--to were read with the recording's first clock and the times printed with the
    clock of each gap's time: after a clock set an hour on, `--from 13:02:00` found nothing
    of the gaps printed at 13:02, and `--from 12:02:03` listed gaps printed at 13:02."""
    path = stepped(formats, tmp_path, kind)
    assert main(["report", "--top", "100", str(path)]) == 0
    printed = longest_lines(capsys.readouterr().out)
    for start, end in [("13:02:00", "13:02:10"), ("12:02:03", "12:02:59"),
                       ("12:01:55", "13:02:05"), ("13:00:00", "14:00:00")]:  # fmt: skip
        want = [line for line in printed if start <= line.split(" at ")[1] < end]
        assert main(["report", "--top", "100", "--from", start, "--to", end, str(path)]) == 0
        assert longest_lines(capsys.readouterr().out) == want, (start, end)
    assert len([line for line in printed if "at 13:02:0" in line]) > 0


def test_a_clock_reference_out_of_time_order_is_said_not_dropped(
    formats: dict[str, Path], tmp_path: Path, utc: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A meta.clock taken before the latest one read (records of two timelines read one
    after the other) was dropped without a word, whatever it said of the clock. One that
    none of the others bears out is not followed, and said: by how far it puts the clock."""
    with TraceReader(EXAMPLE) as reader:
        clock = reader.header.clock
    lines = formats[EVENTS].read_bytes().splitlines(keepends=True)
    half, late = (orjson.loads(lines[n])["ts_ns"] for n in (len(lines) // 2, len(lines) * 3 // 4))

    def ref(at: int, ahead: int) -> bytes:
        return orjson.dumps(to_record(ClockRef(ts_ns=at, realtime_ns=wall_ns(clock, at) + ahead)))

    path = tmp_path / "edited.ndjson"
    at = len(lines) * 3 // 4
    path.write_bytes(b"".join([*lines[:at], ref(late, HOUR) + b"\n", *lines[at:],
                               ref(half, HOUR // 2) + b"\n"]))  # fmt: skip
    assert main(["report", "--top", "100", str(path)]) == 0
    out = capsys.readouterr().out
    (said,) = [line for line in out.splitlines() if "out of time order" in line]
    assert said.startswith("clock: a wall-clock reference out of time order (taken before one")
    assert said.endswith(" says 2026-12-01 12:32:01.254390 +0000 where the times shown say "
                         "12:02:01.254390 (+1800.000 s): not followed")  # fmt: skip
    hours = Counter(line.split(" at ")[1][:2] for line in longest_lines(out))
    assert set(hours) == {"12", "13"}  # the half hour followed by none
    assert main(["gaps", "--replay-events", str(path)]) == 0
    assert f"# {said}" in capsys.readouterr().err


def _earlier(ev: Event, by_ns: int) -> Event:
    """An event as a boot whose monotonic clock is `by_ns` behind would have timed it."""
    fields = ("ts_ns", "end_ns", "runnable_ns")
    times = {f: getattr(ev, f) - by_ns for f in fields if getattr(ev, f, 0)}
    return dataclasses.replace(ev, **times)


def two_files(
    tmp_path: Path, *, ahead: int = 0, restart_at: int = 0, boot_ids: tuple[str, str] = ("", "")
) -> Path:
    """The example as two trace files of one recording, the wall clock set `ahead` between
    them (its second file's header takes the new clock); or, with `restart_at`, the second a
    recording of a later boot of the node, five minutes after the first's last record: its
    monotonic clock began again, and its file begins at `restart_at` of it (past the first
    file's records, where the boot came up slower). `boot_ids`: the headers' boot ids (a
    writer of format 1.1), none by default (1.0)."""
    with TraceReader(EXAMPLE) as reader:
        header = reader.header
        events = list(reader)
    half = len(events) // 2
    cut = max(e.ts_ns for e in events[:half])
    out = tmp_path / ("restarted" if restart_at else "rotated")
    out.mkdir()
    rest = events[half:]
    moved = ClockRef(ts_ns=cut, realtime_ns=wall_ns(header.clock, cut) + ahead)
    second = dataclasses.replace(header, segment=1, start_ns=cut, clock=moved)
    if restart_at:
        back = min(e.ts_ns for e in rest) - restart_at - 1_000_000
        booted = wall_ns(header.clock, cut) + 300_000_000_000  # by its clock
        rest = [_earlier(e, back) for e in rest]
        clock = ClockRef(ts_ns=restart_at, realtime_ns=booted + restart_at)
        second = dataclasses.replace(header, session="b007ed0a9a10", start_ns=restart_at,
                                     clock=clock)  # fmt: skip
    header = dataclasses.replace(header, boot_id=boot_ids[0])
    second = dataclasses.replace(second, boot_id=boot_ids[1])
    for name, hdr, part in (("a", header, events[:half]), ("b", second, rest)):
        with TraceWriter(out / f"{name}.gjtrace", hdr) as w:
            for ev in part:
                w.write(ev)
    return out


def test_a_clock_set_between_the_files_of_a_recording_is_followed_and_said(
    tmp_path: Path, utc: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each file's header takes the wall clock afresh, and the readers took the first's
    only: a clock set an hour on while the daemon was stopped printed the next file's gaps an
    hour early, without a word. Its header is read as the meta.clock the daemon would have
    sent: the gaps after it by the new clock, said with the file where it was found."""
    rotated = two_files(tmp_path, ahead=HOUR)
    assert main(["report", "--top", "100", str(rotated)]) == 0
    out = capsys.readouterr().out
    (said,) = [line for line in out.splitlines() if line.startswith("clock: ")]
    assert said.startswith(
        "clock: the wall clock was set +3600.000 s between the recording's files, by the time "
        f"{rotated / 'b.gjtrace'} began at 2026-12-01 12:02:01."
    ) and said.endswith("by the new clock")
    printed = longest_lines(out)
    hours = Counter(line.split(" at ")[1][:2] for line in printed)
    assert hours["12"] and hours["13"] and hours["12"] + hours["13"] == 32
    assert main(["report", "--top", "100", "--from", "13:00:00", str(rotated)]) == 0
    assert longest_lines(capsys.readouterr().out) == [p for p in printed if " at 13:" in p]
    assert main(["gaps", "--replay-events", str(rotated)]) == 0
    assert f"# {said}" in capsys.readouterr().err


def test_a_restart_between_the_files_of_a_recording_is_said_and_moves_no_earlier_time(
    tmp_path: Path, utc: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A later boot's file (the node restarted: its monotonic clock began again) begins at a
    monotonic time the files before it passed: its header's clock followed from there would
    print the earlier boot's later gaps by the later boot's clock. The restart is said, and
    the earlier boot's gaps print as they do alone; gaps --replay-events says where the
    later boot's gaps begin, and each boot's span at the end."""
    restarted = two_files(tmp_path, restart_at=265_000_000_000)  # its first file: from 258 s
    assert main(["report", "--top", "100", str(restarted / "a.gjtrace")]) == 0
    alone = longest_lines(capsys.readouterr().out)
    assert main(["report", "--top", "100", str(restarted)]) == 0
    out = capsys.readouterr().out
    assert set(alone) < set(longest_lines(out))
    assert "the node restarted during the recording: 2 boots" in out
    assert main(["gaps", "--replay-events", str(restarted)]) == 0
    err = capsys.readouterr().err
    assert "# the node restarted: boot 2, no boot id (a restart told by its times), its clock " \
        "from 2026-12-01 12:11:26." in err  # fmt: skip
    assert "# boot 2 of 2: no boot id (a restart told by its times), 2026-12-01 12:11:26." in err


def sections(report: str) -> dict[str, list[str]]:
    """A report's longest gaps per boot section ("boot 1 of 2: ..." lines), by that line."""
    out: dict[str, list[str]] = {}
    at = ""
    for line in report.splitlines():
        if line.startswith("boot "):
            at = line
        elif " idle " in line and " at " in line:
            out.setdefault(at, []).append(line)
    return out


def alone(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[list[str], Any]:
    """A file's longest gaps and --json summary as report gives them read alone."""
    assert main(["report", "--top", "100", *args, str(path)]) == 0
    lines = longest_lines(capsys.readouterr().out)
    assert main(["report", "--json", *args, str(path)]) == 0
    return lines, json.loads(capsys.readouterr().out)


def test_a_recording_across_a_restart_is_read_boot_by_boot_each_by_its_own_clock(
    tmp_path: Path, utc: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A later boot's records were read after the earlier boot's, through one engine run and
    out of time order, and printed by the earlier boot's clock (as early as 11:56 for a boot
    of 12:07). Each boot (told here by its times: files of format 1.0) goes through its own
    gap detection and attribution, its section introduced by one line and shown by its own
    clock: each boot's gaps are those of its files read alone, at the same times."""
    restarted = two_files(tmp_path, restart_at=265_000_000_000)
    first, first_doc = alone(restarted / "a.gjtrace", capsys)
    second, second_doc = alone(restarted / "b.gjtrace", capsys)
    assert main(["report", "--top", "100", str(restarted)]) == 0
    out = capsys.readouterr().out
    assert "the node restarted during the recording: 2 boots" in out
    got = sections(out)
    assert list(got) == [
        "boot 1 of 2: no boot id, 2026-12-01 12:01:44.774708 +0000 to 12:02:01.234681",
        "boot 2 of 2: no boot id (a restart told by its times), 2026-12-01 "
        "12:11:26.235681 +0000 to 12:11:42.429403",
    ]
    assert list(got.values()) == [first, second]
    assert main(["report", "--json", str(restarted)]) == 0
    doc = json.loads(capsys.readouterr().out)
    boots = doc["boots"]
    assert [b["summary"] for b in boots] == [first_doc["summary"], second_doc["summary"]]
    assert [b["attributions"] for b in boots] == [
        len(first_doc["attributions"]),
        len(second_doc["attributions"]),
    ]
    assert doc["attributions"] == first_doc["attributions"] + second_doc["attributions"]
    # --from/--to by the wall clock each boot's gaps are printed by
    assert main(["report", "--top", "100", "--from", "12:05:00", str(restarted)]) == 0
    assert [g for g in sections(capsys.readouterr().out).values() if g] == [second]
    assert main(["report", "--top", "100", "--to", "12:05:00", str(restarted)]) == 0
    assert [g for g in sections(capsys.readouterr().out).values() if g] == [first]
    # a GPU no boot had gaps on is said once, for the recording, not once a boot
    assert main(["report", "--gpu", "7", str(restarted)]) == 0
    assert capsys.readouterr().out.count("GPU7: not in this recording") == 1


def test_a_restart_the_times_hide_is_told_by_the_headers_boot_ids(
    tmp_path: Path, utc: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A later boot whose monotonic times begin above the earlier boot's records (a slower
    boot, a shorter run before it) is no restart by its times: its header's clock was
    followed as a clock set between the files, and both boots went through one engine run.
    The headers' boot ids tell it: each boot on its own, as read alone."""
    ids = ("3f9c2a7d-1e04-4b4e-9a52-6c1d0e7b8f21", "b007ed0a-9a10-4c2e-8d11-0a9e7c6b5d43")
    above = two_files(tmp_path, restart_at=700_000_000_000, boot_ids=ids)
    first, first_doc = alone(above / "a.gjtrace", capsys)
    second, second_doc = alone(above / "b.gjtrace", capsys)
    assert main(["report", "--top", "100", str(above)]) == 0
    out = capsys.readouterr().out
    got = sections(out)
    assert [line.split(",")[0] for line in got] == [
        "boot 1 of 2: 3f9c2a7d",
        "boot 2 of 2: b007ed0a",
    ]
    assert list(got.values()) == [first, second]
    assert not [line for line in out.splitlines() if line.startswith("clock: ")]
    assert main(["report", "--json", str(above)]) == 0
    boots = json.loads(capsys.readouterr().out)["boots"]
    assert [(b["boot_id"], b["summary"]) for b in boots] == [
        (ids[0], first_doc["summary"]),
        (ids[1], second_doc["summary"]),
    ]
    # trace names each file's boot, and the boots
    assert main(["trace", str(above)]) == 0
    listed = capsys.readouterr().out
    assert f"segment 0, boot {ids[0]}" in listed and f"segment 0, boot {ids[1]}" in listed
    assert "boots: 2, 3f9c2a7d: 1 file(s); b007ed0a: 1 file(s)" in listed
    # what reads it as one stream (trace, export, top --replay) says the restart the ids
    # tell, and follows no clock after it
    rec = open_recording([above])
    clocks = rec.clocks()
    for ev in rec:
        if type(ev) is ClockRef:
            clocks.add(ev)
    (said,) = clocks.notes
    assert said.startswith(f"clock: the node restarted before {above / 'b.gjtrace'} began")
    # each file read alone, one boot: its report as before, no section
    assert "boot " not in "".join(first) and "boots" not in first_doc


@pytest.mark.parametrize("kind", [TRACE, EVENTS, LOG])
def test_each_format_is_told_by_its_content(formats: dict[str, Path], kind: str) -> None:
    rec = open_recording([formats[kind]])
    assert rec.kind == kind
    assert rec.analysed == (kind == LOG)
    assert rec.wall_clock == (kind != LOG)  # a log carries no clock reference


@pytest.mark.parametrize("kind", [EVENTS, LOG])
def test_a_byte_order_mark_before_the_first_line_is_read_past(
    formats: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """An editor on some systems saves UTF-8 with a byte-order mark first: the file was
    "not a gpujitter recording" (sniff), and its first line damage to the readers."""
    marked = tmp_path / formats[kind].name
    marked.write_bytes(codecs.BOM_UTF8 + formats[kind].read_bytes())
    rec = open_recording([marked])
    assert rec.kind == kind
    assert (
        _run_json(["report", "--json", str(marked)])["summary"]
        == _run_json(["report", "--json", str(formats[kind])])["summary"]
    )
    held = _run_json(["trace", "--json", str(marked)])
    assert (
        held["damage"] == []
        and held["kinds"] == _run_json(["trace", "--json", str(formats[kind])])["kinds"]
    )


@pytest.mark.parametrize("kind", [EVENTS, LOG])
@pytest.mark.parametrize("first", [b"\0\0\0\0", b'{"time": 1', b"[]"])
def test_a_damaged_first_line_is_damage_not_another_file(
    formats: dict[str, Path], tmp_path: Path, kind: str, first: bytes
) -> None:
    """The first line alone said what a file was: one damaged there (a crash's zeros, a torn
    edit) refused the whole recording after it as "not a gpujitter recording"."""
    damaged = tmp_path / formats[kind].name
    damaged.write_bytes(first + b"\n" + formats[kind].read_bytes())
    assert open_recording([damaged]).kind == kind
    got = _run_json(["report", "--json", str(damaged)])
    assert got["summary"] == _run_json(["report", "--json", str(formats[kind])])["summary"]
    assert len(got["damage"]) == 1 and "line 1, " in got["damage"][0]

    # what no line among the first 16 tells is none of gpujitter's
    untold = tmp_path / "untold.ndjson"
    untold.write_bytes(first + b"\n" * 2 + b"junk\n" * 15 + formats[kind].read_bytes())
    with pytest.raises(GpujitterError, match="not a gpujitter recording"):
        open_recording([untold])


def test_a_logs_copy_named_beside_it_is_refused(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace's copy is refused by its header; a log's copy named beside it doubled every
    gap, idle time and share of the report without a word. Its rotated files, named
    together, are read as ever."""
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(formats[LOG].read_bytes())
    for argv in (["report"], ["trace"]):
        assert main([*argv, str(formats[LOG]), str(copy)]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "begin with the same attribution" in err[0], err
    lines = formats[LOG].read_bytes().splitlines(keepends=True)
    older, newer = tmp_path / "a.jsonl.1", tmp_path / "a.jsonl"
    older.write_bytes(b"".join(lines[: len(lines) // 2]))
    newer.write_bytes(b"".join(lines[len(lines) // 2 :]))
    want = _run_json(["report", "--json", str(formats[LOG])])
    got = _run_json(["report", "--json", str(older), str(newer)])
    assert got["summary"] == want["summary"]

    # A copy of a part of it (whichever is named first), or a log joined with its copy,
    # counted every repeated gap twice (63 gaps for 32): refused in one line once met.
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(lines[2:]))
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes(b"".join(lines * 2))
    for named, said in [
        ([formats[LOG], part], f"{part} and {formats[LOG]} hold the same attributions"),
        ([part, formats[LOG]], f"{formats[LOG]} and {part} hold the same attributions"),
        ([joined], f"{joined} holds its attributions twice"),
    ]:
        assert main(["report", *map(str, named)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


@pytest.mark.parametrize("kind", [EVENTS, LOG])
def test_report_of_any_format_equals_the_traces(formats: dict[str, Path], kind: str) -> None:
    want = _run_json(["report", "--json", str(formats[TRACE])])
    got = _run_json(["report", "--json", str(formats[kind])])
    assert got["format"] == kind
    assert got["summary"] == want["summary"]
    if kind == EVENTS:
        # No topology in an events file: the GPU's node, the disks' names and the free
        # CPUs are not known, so evidence and remedies say less; the division of time is
        # the same.
        assert {a["gpu_node"] for a in got["attributions"]} == {-1}
        got["attributions"], want["attributions"] = (
            [[(a["ts_ns"], p["cause"], p["ns"]) for p in a["parts"]] for a in x["attributions"]]
            for x in (got, want)
        )
    assert got["attributions"] == want["attributions"]


def test_report_says_what_it_reads_and_keeps_times_honest(
    formats: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(formats[LOG])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("an attribution log (attributions as logged, not re-analysed): ")
    assert "GPU0 idle 35.99ms at t=" in out  # no wall clock in a log: no invented dates
    assert main(["report", "--from", "12:01:50", str(formats[LOG])]) == 2
    assert "has no wall clock: give times as +OFFSET" in capsys.readouterr().err
    assert main(["report", str(formats[EVENTS])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("an events file (gaps --save-events): ")
    assert "GPU0 idle 35.99ms at 12:0" in out  # the file's own clock


@pytest.mark.parametrize("kind", [TRACE, EVENTS, LOG])
def test_gaps_replay_reads_every_format_with_the_same_gaps(
    formats: dict[str, Path], kind: str
) -> None:
    def gaps(path: Path) -> list[tuple[int, int]]:
        printed = _run(["gaps", "--replay-events", str(path), "--json"]).splitlines()
        return [(r["ts_ns"], r["end_ns"]) for r in map(json.loads, printed)]

    attributed = _run_json(["report", "--json", str(formats[TRACE])])["attributions"]
    # Every attributed gap is among the detector's (a log holds only the attributed ones).
    assert {(a["ts_ns"], a["end_ns"]) for a in attributed} <= set(gaps(formats[kind]))
    if kind != LOG:
        assert gaps(formats[kind]) == gaps(formats[TRACE])


@pytest.mark.parametrize("kind", [EVENTS, LOG])
def test_trace_summarises_any_format(
    formats: dict[str, Path], kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _run_json(["trace", "--json", str(formats[kind])])
    assert got["format"] == kind and got["readable"] and got["damage"] == []
    if kind == LOG:
        assert got["kinds"] == {"gpu.attribution": 32}
    else:
        with TraceReader(EXAMPLE) as reader:
            assert got["events"] == sum(1 for _ in reader) + 1  # and the meta.clock
        # the span is the earliest to the latest event, as for the trace (not the first and
        # the last line, which a file out of time order turned around)
        whole = _run_json(["trace", "--json", str(EXAMPLE)])["files"][0]
        assert (got["first_ns"], got["last_ns"]) == (whole["first_ns"], whole["last_ns"])
        lines = formats[kind].read_bytes().splitlines(keepends=True)
        backwards = formats[kind].with_name("backwards.ndjson")
        backwards.write_bytes(lines[0] + b"".join(reversed(lines[1:])))
        turned = _run_json(["trace", "--json", str(backwards)])
        assert (turned["first_ns"], turned["last_ns"]) == (whole["first_ns"], whole["last_ns"])


def test_a_torn_events_file_is_read_to_its_tear(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = formats[EVENTS].read_bytes()
    torn = tmp_path / "torn.ndjson"
    torn.write_bytes(whole[: len(whole) - 40])  # the writer stopped mid-line
    rec = open_recording([torn])
    n = sum(1 for _ in rec)
    assert n == whole.count(b"\n") - 1
    assert rec.damage == [f"{torn}: torn last line ({len(whole.splitlines()[-1]) - 39} bytes)"]

    # gaps --replay-events says so too (it said nothing, exit 0, as if the file were whole)
    main(["gaps", "--replay-events", str(torn), "--json"])
    assert f"damage: {torn}: torn last line" in capsys.readouterr().err


def test_a_line_too_long_inside_an_events_file_is_damage(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Read as a torn last line, it ended the read there in silence: 100 events of 2,841,
    no gap, exit 0. It is damage, skipped and said; the events after it are read."""
    lines = formats[EVENTS].read_bytes().splitlines(keepends=True)
    long = tmp_path / "long.ndjson"
    long.write_bytes(b"".join(lines[:100]) + b" " * (2 << 20) + b"\n" + b"".join(lines[100:]))
    note = f"{long}: 1 damaged line(s) skipped, the first: line 101, over 1048576 bytes"
    assert main(["gaps", "--replay-events", str(long), "--json"]) == 0
    out, err = capsys.readouterr()
    assert note in err
    assert main(["gaps", "--replay-events", str(formats[EVENTS]), "--json"]) == 0
    assert capsys.readouterr().out == out  # every gap of the whole file
    assert main(["report", str(long)]) == 0
    assert note in capsys.readouterr().out
    assert main(["trace", str(long)]) == 1
    assert note in capsys.readouterr().out
    rec = open_recording([long])
    assert sum(1 for _ in rec) == len(lines) and rec.corrupt == 1
    # progress counts the damaged run's bytes: it ends at the file's size (it jumped past
    # the 2 MiB before), and runs on over a second file named
    assert rec.position() == rec.size == long.stat().st_size
    both = open_recording([long, formats[EVENTS]])
    seen = [both.position() for _ in both]
    assert seen == sorted(seen) and both.position() == both.size
    # a line of the longest length read whole (its newline past it) is no damage
    edge = tmp_path / "edge.ndjson"
    edge.write_bytes(b"".join(lines[:100]) + b" " * (1 << 20) + b"\n" + b"".join(lines[100:]))
    assert sum(1 for _ in open_recording([edge])) == len(lines)


def test_a_crashs_block_of_zeros_over_several_lines_is_said_by_what_it_cost(
    formats: dict[str, Path], tmp_path: Path
) -> None:
    """A block of zeros (a crash: the file's length reached the disk, its data did not) over
    33 lines holds none of their newlines: it read as "1 damaged line(s) skipped", as one
    bad record would. Its bytes and zeros are said, and that the records in it are lost."""
    whole = formats[EVENTS].read_bytes()
    at = 100 * 4096
    zeros = tmp_path / "zeros.ndjson"
    zeros.write_bytes(whole[:at] + bytes(8192) + whole[at + 8192 :])
    lost = whole[at : at + 8192].count(b"\n") + 1  # the lines it overwrote and the one it cut
    begun = whole.rindex(b"\n", 0, at) + 1  # the damaged line: from the cut one's start
    ended = whole.index(b"\n", at + 8192) + 1  # to the end of the one its end cut into
    rec = open_recording([zeros])
    assert sum(1 for _ in rec) == whole.count(b"\n") - lost and rec.corrupt == 1
    line = whole[:at].count(b"\n") + 1
    assert rec.damage == [
        f"{zeros}: 1 damaged line(s) skipped, the first: line {line}, not a JSON line; "
        f"{ended - begun} bytes in all, 8192 of them zeros (a crash's block that never "
        "reached the disk: the records it overwrote are lost, how many is not known); the "
        "file is damaged"
    ]


@pytest.mark.parametrize("kind", [EVENTS, LOG])
def test_a_crashs_block_of_zeros_at_the_end_is_said_as_zeros(
    formats: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """At the file's end a crash's block of zeros (over the last lines, and past them as the
    file grew) holds no newline: it was noted as a "torn last line (8192 bytes)", as if the
    writer had stopped in one line. It is said as zeros, as such a block elsewhere is."""
    whole = formats[kind].read_bytes()
    at = whole.rindex(b"\n", 0, len(whole) - 1000) + 1 + 30  # into a line, lines after it
    zeros = tmp_path / f"zeros.{kind}"
    zeros.write_bytes(whole[:at] + bytes(8192))
    rec = open_recording([zeros])
    assert sum(1 for ev in rec if ev.KIND != "meta.clock") > 0
    assert rec.damage == [
        f"{zeros}: torn last line (8222 bytes), 8192 of them zeros (a crash's block that never "
        "reached the disk: the records it overwrote are lost, how many is not known)"
    ]
    # a line cut short without zeros is said as it was
    zeros.write_bytes(whole[:at])
    rec = open_recording([zeros])
    assert sum(1 for _ in rec) and rec.damage == [f"{zeros}: torn last line (30 bytes)"]


def test_a_logged_attribution_whose_parts_do_not_add_up_to_its_gap_is_damage(
    formats: dict[str, Path], tmp_path: Path
) -> None:
    """A log line whose causes came to more than its gap (or less) was read as it was: shares
    over 100 % in the report, idle time that went to no cause. The engine's parts add up to
    the gap exactly and the log writes them unrounded: such a line is damage, said, and the
    rest read. The one slack is a double's spacing past 2**53 ns (104 days of uptime), where
    a tool that reads numbers as doubles (jq 1.6) gives ts_ns and end_ns back rounded."""
    lines = formats[LOG].read_text().splitlines(keepends=True)
    want = _run_json(["report", "--json", str(formats[LOG])])
    for extra in (1, -1, 10_000_000):
        rec = json.loads(lines[5])
        rec["parts"][-1]["ns"] += extra  # (still not negative)
        changed = tmp_path / "changed.jsonl"
        changed.write_text("".join([*lines[:5], json.dumps(rec) + "\n", *lines[6:]]))
        total = sum(p["ns"] for p in rec["parts"])
        got = _run_json(["report", "--json", str(changed)])
        assert got["damage"] == [
            f"{changed}: 1 damaged line(s) skipped, the first: line 6, bad gpu.attribution "
            f"record: parts add up to {total} ns, the gap is {total - extra} ns; "
            f"{len(json.dumps(rec)) + 1} bytes in all; the file is damaged"
        ]
        assert len(got["attributions"]) == len(want["attributions"]) - 1

    # a node up 200 days, its log read back through doubles (as jq 1.6 writes it): no
    # damage; parts 3 ns off their gap, past a double's spacing there (2 ns), are
    def off(rec: dict) -> int:
        return sum(p["ns"] for p in rec["parts"]) - (rec["end_ns"] - rec["ts_ns"])

    rounded = [json.loads(line) for line in lines]
    for rec in rounded:
        for key in ("ts_ns", "end_ns"):
            rec[key] = int(float(rec[key] + 200 * 86_400 * 10**9))
    assert 0 < max(abs(off(rec)) for rec in rounded) <= 2
    uptime = tmp_path / "uptime.jsonl"
    uptime.write_text("".join(json.dumps(rec) + "\n" for rec in rounded))
    assert _run_json(["report", "--json", str(uptime)])["damage"] == []
    rounded[5]["parts"][-1]["ns"] += 3 - off(rounded[5])
    uptime.write_text("".join(json.dumps(rec) + "\n" for rec in rounded))
    (note,) = _run_json(["report", "--json", str(uptime)])["damage"]
    assert "line 6, bad gpu.attribution record: parts add up to" in note


def test_an_events_time_leaping_away_and_back_is_damage_and_a_pause_is_not(
    formats: dict[str, Path], tmp_path: Path
) -> None:
    """One power sample an hour ahead moved the engine's clock an hour on: every event after
    it came too late, and the gaps' host work read as unexplained, without a word of damage.
    One at 2**62 ns did the same."""
    lines = formats[EVENTS].read_bytes().splitlines(keepends=True)
    want = _run_json(["report", "--json", str(formats[EVENTS])])
    i = next(n for n in range(1000, len(lines)) if b'"gpu.sample"' in lines[n])
    sample = orjson.loads(lines[i])
    for ts_ns, said in [
        (sample["ts_ns"] + HOUR, f"line {i + 1}, its time is 3600 s past the events around it"),
        (2**62, f"line {i + 1}, bad gpu.sample record: ends at {2**62} ns, decades past"),
    ]:
        leap = tmp_path / "leap.ndjson"
        leap.write_bytes(b"".join([*lines[:i], orjson.dumps(sample | {"ts_ns": ts_ns}) + b"\n",
                                   *lines[i + 1 :]]))  # fmt: skip
        got = _run_json(["report", "--json", str(leap)])
        assert len(got["damage"]) == 1 and said in got["damage"][0]
        assert got["summary"] == want["summary"]
        assert got["attributions"] == want["attributions"]

    # The same hour as a pause: every event from there on an hour later, read whole.
    paused = tmp_path / "paused.ndjson"
    later = [orjson.loads(line) for line in lines[i:]]
    for rec in later:
        rec["ts_ns"] += HOUR
        if "end_ns" in rec:
            rec["end_ns"] += HOUR
    paused.write_bytes(b"".join([*lines[:i], *(orjson.dumps(r) + b"\n" for r in later)]))
    rec = open_recording([paused])
    assert sum(1 for _ in rec) == len(lines) and rec.damage == [] and rec.corrupt == 0


def test_events_out_of_time_order_are_said_not_dropped_in_silence(
    formats: dict[str, Path], tmp_path: Path
) -> None:
    """Records written long after later ones (a file edited, two recordings of one node that
    overlap in time named together) came after the engine had attributed the gaps they fell
    in: their time went to the gaps' unexplained share without a word."""
    lines = formats[EVENTS].read_bytes().splitlines(keepends=True)
    assert _run_json(["report", "--json", str(formats[EVENTS])])["damage"] == []
    moved = [n for n, line in enumerate(lines[1:2000], 1) if b'"sched.offcpu"' in line]
    late = tmp_path / "late.ndjson"
    late.write_bytes(
        b"".join(line for n, line in enumerate(lines) if n not in moved)
        + b"".join(lines[n] for n in moved)
    )
    (note,) = _run_json(["report", "--json", str(late)])["damage"]
    assert note.startswith(f"{len(moved)} events came over 2.00s after later ones")
    assert f"damage: {note}" in _run(["report", str(late)])


def test_a_log_left_empty_by_its_rotation_is_read_with_its_rotated_files(
    formats: dict[str, Path], tmp_path: Path
) -> None:
    """A daemon's log is empty until its first attribution, and again right after it was
    rotated: named, it is the log whose rotated files hold the records."""
    log = tmp_path / "attributions.jsonl"
    (tmp_path / "attributions.jsonl.1").write_bytes(formats[LOG].read_bytes())
    log.write_bytes(b"")
    got = _run_json(["report", "--json", str(log)])
    assert got["format"] == LOG
    assert got["summary"] == _run_json(["report", "--json", str(formats[LOG])])["summary"]


def test_a_rotated_log_that_is_no_regular_file_is_refused_not_waited_on(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO named like a rotated file (NAME.1) was opened as one: the read waited for ever."""
    log = tmp_path / "attributions.jsonl"
    log.write_bytes(formats[LOG].read_bytes())
    os.mkfifo(tmp_path / "attributions.jsonl.1")
    assert main(["report", str(log)]) == 2
    assert "attributions.jsonl.1: not a regular file" in capsys.readouterr().err


def test_a_directorys_entry_that_is_no_trace_file_is_left_out(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dangling link, a link loop or a folder named like a trace among a directory's
    traces refused the whole recording in one line (a folder's traces were read into it);
    each is left out and said, as a damaged segment is."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.gjtrace").write_bytes(formats[TRACE].read_bytes())
    (d / "latest.gjtrace").symlink_to(tmp_path / "gone.gjtrace")
    (d / "loop.gjtrace").symlink_to("loop.gjtrace")
    (d / "nested.gjtrace").mkdir()
    (d / "nested.gjtrace" / "b.gjtrace").write_bytes(formats[TRACE].read_bytes())
    want = _run_json(["report", "--json", str(formats[TRACE])])
    got = _run_json(["report", "--json", str(d)])
    assert got["summary"] == want["summary"]
    assert [note.split(": ", 1)[0] for note in got["damage"]] == [
        f"cannot open {d / name}" for name in ("latest.gjtrace", "loop.gjtrace", "nested.gjtrace")
    ]
    assert all(note.endswith("; left out") for note in got["damage"])
    assert main(["trace", str(d)]) == 1


def test_a_fifo_among_a_directorys_traces_is_left_out_not_waited_on(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The paths named are checked before they are opened; the traces found in a directory
    were opened as they came, and a FIFO among them held trace, report, export and top
    --replay for ever. Here a reader that opens it is let go (a writer comes and goes)."""
    import threading
    import time

    (tmp_path / "d").mkdir()
    trace = tmp_path / "d" / "a.gjtrace"
    trace.write_bytes(formats[TRACE].read_bytes())
    fifo = tmp_path / "d" / "z.gjtrace"
    os.mkfifo(fifo)
    opened, done = [], threading.Event()

    def writer() -> None:  # opens only while a reader holds the FIFO open
        while not done.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                opened.append(1)
            except OSError:
                time.sleep(0.01)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        assert main(["trace", str(tmp_path / "d")]) == 1  # damaged: one file left out
        assert f"damage: cannot open {fifo}: not a regular file" in capsys.readouterr().out
        assert main(["report", str(tmp_path / "d"), "--json"]) == 0
        capsys.readouterr()
        out = tmp_path / "out.json"
        assert main(["export", str(tmp_path / "d"), "-o", str(out)]) == 0
        assert out.stat().st_size > 0
    finally:
        done.set()
        thread.join()
    assert not opened


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"hello\n", "not a gpujitter recording"),
        (b"", "empty, nothing recorded in it"),
        (b'{"type": "no.such.kind", "ts_ns": 1}\n', "not a gpujitter recording"),
        (b'{"schema": "gpujitter.stream/1", "type": "hello"}\n', "play it with gpujitter top"),
        (b"\x89GJTRAC", "not a gpujitter recording"),
    ],
)
def test_anything_else_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, why: str
) -> None:
    path = tmp_path / "x"
    path.write_bytes(content)
    commands = [["report"], ["trace"], ["gaps", "--replay-events"]]
    if b"gpujitter.stream/" not in content:  # a captured stream is what top plays
        commands.append(["top", "--replay"])
    for argv in commands:
        assert main([*argv, str(path)]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1 and "Traceback" not in err


def test_mixed_kinds_are_refused(formats: dict[str, Path]) -> None:
    with pytest.raises(GpujitterError, match="mixed recordings"):
        open_recording([formats[TRACE], formats[LOG]])


def test_export_draws_an_events_file_and_refuses_a_log(
    formats: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    assert main(["export", str(formats[EVENTS]), "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gaps"] == 32
    assert main(["export", str(formats[LOG]), "-o", str(out)]) == 2
    assert "holds no events to draw" in capsys.readouterr().err


def _as_another_user(call: Callable[[], object]) -> str:
    """What `call` says (its one-line error, or "ok") as a user who is not root where this
    process is (root passes every permission check)."""

    def said() -> str:
        try:
            call()
        except GpujitterError as err:
            return str(err)
        return "ok"

    return str(in_child(said, as_nobody))


def test_a_path_this_user_may_not_reach_is_one_line(tmp_path: Path) -> None:
    # A log under a directory without search permission for the reader: `report`, `trace`
    # and `top --replay` ended in "internal error: PermissionError", and a directory that
    # could not be listed read as one with no traces in it.
    shut = tmp_path / "shut"
    shut.mkdir()
    (shut / "a.jsonl").write_bytes(b"x")
    (shut / "b.gjtrace").write_bytes(b"x")
    shut.chmod(0)
    tmp_path.chmod(0o755)
    try:
        for call in (
            lambda: sniff(shut / "a.jsonl"),
            lambda: trace_paths([shut / "a.jsonl"]),
            lambda: open_recording([shut]),
        ):
            said = _as_another_user(call)
            assert said.startswith("cannot read ") and said.endswith(": Permission denied"), said
        assert _as_another_user(lambda: rotated_files(shut / "a.jsonl")) == "ok"
    finally:
        shut.chmod(0o700)


def test_a_segment_whose_start_is_damaged_is_left_out_of_its_set(tmp_path: Path) -> None:
    """A flipped bit in one segment's magic made the whole directory 'not a gpujitter
    recording': the reading of its kind came before the set could leave it out."""
    from gpujitter.daemon.sinks.trace import TraceWriter
    from tests.unit.trace_samples import every_kind, header

    events = every_kind()[:3]
    for segment, name in enumerate(("a", "b")):
        with TraceWriter(tmp_path / f"{name}.gjtrace", header(segment=segment)) as w:
            for ev in events:
                w.write(ev)
    raw = bytearray((tmp_path / "b.gjtrace").read_bytes())
    raw[1] ^= 1
    (tmp_path / "b.gjtrace").write_bytes(raw)
    rec = open_recording([tmp_path])
    assert list(rec) == events
    (note,) = rec.damage
    assert "b.gjtrace" in note and "left out" in note
    with pytest.raises(GpujitterError, match="not a gpujitter recording"):
        open_recording([tmp_path / "b.gjtrace"])  # alone: nothing else to read
