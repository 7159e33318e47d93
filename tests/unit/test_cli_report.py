"""`gpujitter report`'s options as an operator types them: times as journalctl, Prometheus
and Grafana print them, counts, GPUs that are not in the recording."""

from __future__ import annotations

import gc
import io
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from gpujitter.cli import main
from gpujitter.cli.output import print_json
from gpujitter.daemon.analysis.gaps import UNKNOWN_GPU
from gpujitter.daemon.analysis.pipeline import Pipeline
from gpujitter.daemon.analysis.records import Attribution, Part, TaskEvidence
from gpujitter.daemon.offline.recordings import open_recording
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.trace import TraceWriter
from gpujitter.probes.clock import wall_ns
from gpujitter.probes.events import ClockRef, to_record
from tests.fixtures.streams.synthetic import MS, T0, TWO_NODES, Stream
from tests.unit.trace_samples import header, one_gap_trace


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return one_gap_trace(tmp_path / "one.gjtrace")


def iso_z(path: Path, mono_ns: int) -> str:
    """The wall time of a point of the recording as Prometheus and Grafana print it."""
    clock = header(topology=TWO_NODES).clock
    at = datetime.fromtimestamp(wall_ns(clock, T0 + mono_ns) / 1e9, UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def gaps_listed(out: str) -> int:
    return out.count("GPU0 idle")


def test_from_and_to_take_iso_8601_times_in_utc(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(trace), "--from", iso_z(trace, 99 * MS)]) == 0
    assert gaps_listed(capsys.readouterr().out) == 1
    assert main(["report", str(trace), "--from", iso_z(trace, 101 * MS)]) == 0
    assert gaps_listed(capsys.readouterr().out) == 0
    assert main(["report", str(trace), "--to", iso_z(trace, 101 * MS)]) == 0
    assert gaps_listed(capsys.readouterr().out) == 1


def test_the_recordings_start_is_printed_with_its_zone(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(trace)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.split("recorded from ")[1].split(";")[0][-5:-4] in "+-"  # e.g. +0000


def test_a_negative_top_is_refused(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(trace), "--top", "-3"])
    assert exit_.value.code == 2
    assert "want a whole number, 0 or more" in capsys.readouterr().err


def test_a_gpu_not_in_the_recording_is_said(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(trace), "--gpu", "7"]) == 0
    out = capsys.readouterr().out
    assert "GPU7: not in this recording (GPUs with gaps: GPU0)" in out


def test_the_header_line_says_the_override_placed_gpu_minus_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    placed = replace(TWO_NODES, override="split.toml", unknown_gpu_node=0)
    s = Stream(placed).migrate(90, 0, 2).ran(0, 1000, node=1).gap(100, 140, gpu=UNKNOWN_GPU)
    with TraceWriter(tmp_path / "placed.gjtrace", header(topology=placed)) as writer:
        for ev in s.in_emission_order():
            writer.write(ev)
    assert main(["report", str(tmp_path / "placed.gjtrace")]) == 0
    out = capsys.readouterr().out
    assert (
        "topology override in force: split.toml; "
        "GPU -1 (no bus id) placed on node 0 by the override"
    ) in out.splitlines()
    assert main(["report", "--json", str(tmp_path / "placed.gjtrace")]) == 0
    (attr,) = json.loads(capsys.readouterr().out)["attributions"]
    assert attr["gpu"] == UNKNOWN_GPU and attr["gpu_node"] == 0
    assert "remote_oncpu" in {p["cause"] for p in attr["parts"]}


def test_the_text_report_holds_the_longest_gaps_not_every_attribution(
    trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A day's recording of a busy node is attributed into hundreds of thousands of gaps:
    the text report keeps their sums and its --top longest, not all of them (it held each
    one: 181 MB for a 170 MB trace, growing with the trace)."""
    alive: list[int] = []

    def attributed(events, topology, config):
        for n in range(2000):
            # durations 1..9 ms, ties among them, all in stream order
            at, dur = T0 + n * 100 * MS, (1 + n % 9) * MS
            yield Attribution(ts_ns=at, end_ns=at + dur, gpu=n % 2, sources=("cuda",),
                              resolution_ns=1_000, confidence=0.9,
                              parts=(Part("host_work", dur - MS), Part("irq", MS)))  # fmt: skip
        gc.collect()
        alive.append(sum(isinstance(o, Attribution) for o in gc.get_objects()))

    monkeypatch.setattr(Pipeline, "run", lambda _, events: attributed(events, None, None))
    assert main(["report", str(trace), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert alive[0] <= 4  # the 3 longest, and the one just yielded
    assert "GPU0: 1000 gaps, 5.00s idle" in out and "GPU1: 1000 gaps, 5.00s idle" in out
    longest = [line for line in out.splitlines() if " idle 9.00ms at " in line]
    # the longest three (9 ms: n = 8, 17, 26, ...), earliest first, as a sort of them all
    assert len(longest) == 3 and out.count("idle 9.00ms") == 3
    assert [line.split()[0] for line in longest] == ["GPU0", "GPU1", "GPU0"]
    assert main(["report", str(trace), "--top", "0"]) == 0
    assert "longest 0 gaps:" in capsys.readouterr().out


# Names a local user chooses (a thread's, a file's), as decode_name and os.fsdecode give them:
# escape sequences, DEL and C1 controls, bidi overrides, a line separator, a tag character
# (outside the BMP), a private-use one, bytes that are not UTF-8 (surrogates, which orjson
# refuses: that record, or the whole document, is written as jsonable makes it).
HOSTILE = (
    "python", "\x1b[31mred\x1b[0m", "caf\udce9", "rtl\u202eexe.gpj", "line\u2028sep\x7f\x9b",
    "tag\U000e0001x", "emoji😀é\ue000", "\\xe9 typed",
)  # fmt: skip


def attributions(n: int, hostile: bool = False) -> Iterator[Attribution]:
    """`n` attributions in stream order on GPUs 0, 1, 3 and -1 (unknown): two at each start
    time, durations 1..9 ms (ties among them), with hostile text where asked."""
    for i in range(n):
        at, dur = T0 + (i // 2) * 100 * MS, (1 + i % 9) * MS
        name = HOSTILE[i % len(HOSTILE)] if hostile else "feeder"
        waited = TaskEvidence(tid=555, comm=name, cpus=(1,), count=1, ns=dur - MS)
        cause = f"host_work{HOSTILE[i % 3]}" if hostile and i % 5 == 0 else "host_work"
        yield Attribution(ts_ns=at, end_ns=at + dur, gpu=(0, 1, 3, UNKNOWN_GPU)[i % 4],
                          sources=("cuda",), resolution_ns=1_000, confidence=0.9,
                          parts=(Part(cause, dur - MS, (i,), (waited,)), Part("irq", MS)),
                          comm=name, workload=name, remedies=(f"fix: {name}",))  # fmt: skip


def whole_document(trace: Path, attrs: list[Attribution]) -> bytes:
    """What `report --json` wrote as one document (every attribution held, then print_json):
    the bytes its streaming must keep."""
    rec = open_recording([str(trace)])
    for _ in rec:  # (the damage is known once read)
        pass
    per_gpu: dict[int, dict[str, Any]] = {}
    for a in attrs:
        s = per_gpu.setdefault(a.gpu, {"gaps": 0, "idle_ns": 0, "causes": Counter()})
        s["gaps"] += 1
        s["idle_ns"] += a.dur_ns
        for part in a.parts:
            s["causes"][part.cause] += part.ns
    doc = {
        "traces": [str(p) for p in rec.paths],
        "format": rec.kind,
        "host": rec.header.host,
        "kernel": rec.header.kernel,
        "start_wall_ns": rec.header.start_wall_ns,
        "topology_override": rec.header.topology.override,
        "topology_unknown_gpu_node": rec.header.topology.unknown_gpu_node,
        "damage": rec.damage,
        "summary": {
            str(g): {**s, "causes": dict(s["causes"].most_common())}
            for g, s in sorted(per_gpu.items())
        },
        "attributions": [to_record(a) for a in attrs],
    }
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw)
    print_json(doc, out)
    return raw.getvalue()


def test_the_json_report_writes_what_the_whole_document_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """--json writes each attribution aside as it comes: the same bytes as the one document
    it wrote from all of them held (keys, order, indentation, escapes), whatever the names."""
    trace = one_gap_trace(tmp_path / os.fsdecode(b"r\xe9c\x1b[2J.gjtrace"))
    with trace.open("ab") as f:
        f.write(b"\x07\x00\x00")  # a torn tail: a damage note, naming the file
    n = 250

    def attributed(events, topology, config):
        for _ in events:  # read (its damage noted), then the hostile attributions
            pass
        yield from attributions(n, hostile=True)

    monkeypatch.setattr(Pipeline, "run", lambda _, events: attributed(events, None, None))
    expected = whole_document(trace, list(attributions(n, hostile=True)))
    doc = json.loads(expected)
    assert doc["damage"] and "\\xe9" in doc["traces"][0] and len(doc["summary"]) == 4
    assert b"\\u001b" in expected and b"\\u202e" in expected and b"\\udb40\\udc01" in expected
    assert main(["report", "--json", str(trace)]) == 0
    assert capsysbinary.readouterr().out == expected
    # with the page too, and with none in range
    page = tmp_path / "page.html"
    assert main(["report", "--json", "--html", str(page), str(trace)]) == 0
    assert capsysbinary.readouterr().out == expected and page.stat().st_size
    assert main(["report", "--json", "--gpu", "7", str(trace)]) == 0
    assert capsysbinary.readouterr().out == whole_document(trace, [])


def test_the_json_report_holds_no_attribution(
    trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json writes every attribution, but holds none of them to the end (it held each one,
    and its document's dicts: 427 MB for a 172 MB trace, growing with the trace)."""
    alive: list[int] = []

    def attributed(events, topology, config):
        yield from attributions(2000)
        gc.collect()
        alive.append(sum(isinstance(o, Attribution) for o in gc.get_objects()))

    monkeypatch.setattr(Pipeline, "run", lambda _, events: attributed(events, None, None))
    assert main(["report", "--json", str(trace), "--top", "3"]) == 0
    assert alive[0] <= 4  # the text report's 3 longest, and the one just yielded
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["attributions"]) == 2000 and list(doc)[-2:] == ["summary", "attributions"]
    assert {g: s["gaps"] for g, s in doc["summary"].items()} == {
        "-1": 500, "0": 500, "1": 500, "3": 500
    }  # fmt: skip


def test_the_html_report_holds_no_attribution(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """--html takes each attribution into the page's sums, counts, longest gaps (as their
    lines) and a few ints for the chart over time: it holds none of them to the end (it held
    each one: 179 MB for a 172 MB trace, growing with the trace)."""
    alive: list[int] = []

    def attributed(events, topology, config):
        yield from attributions(2000, hostile=True)
        gc.collect()
        alive.append(sum(isinstance(o, Attribution) for o in gc.get_objects()))

    monkeypatch.setattr(Pipeline, "run", lambda _, events: attributed(events, None, None))
    page = tmp_path / "page.html"
    assert main(["report", "--html", str(page), str(trace), "--top", "3"]) == 0
    assert alive[0] <= 4  # the text report's 3 longest, and the one just yielded
    text = page.read_text()
    for gpu in ("GPU0", "GPU1", "GPU3", "GPU?"):
        assert f"<h2>{gpu}: 500 gaps" in text
    assert text.count("<h3>The 3 longest gaps</h3>") == 4 and text.count('class="fix"') == 12
    assert "GPU0: 500 gaps" in capsys.readouterr().out


def test_a_temporary_directory_that_takes_no_file_is_one_line(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """--json's attributions go to a temporary file: a directory that is none, or full, is
    said in one line (a full one not as standard output's, which main() says for an OSError
    without a file name), nothing written on standard output."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_dir))
    assert main(["report", "--json", str(trace)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"gpujitter report: error: --json: the attributions' temporary file in {not_a_dir}: "
        "Not a directory (TMPDIR names another directory)\n"
    )
    # a full one: every write refused (as a full tmpfs, a quota); the text report needs none
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def full() -> BinaryIO:
        return open("/dev/full", "w+b")  # (the spool closes it)

    monkeypatch.setattr("gpujitter.cli.report.tempfile.TemporaryFile", full)
    assert main(["report", "--json", str(trace)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"gpujitter report: error: --json: the attributions' temporary file in {tmp_path}: "
        "No space left on device (TMPDIR names another directory)\n"
    )
    assert main(["report", str(trace)]) == 0 and "GPU0: 1 gaps" in capsys.readouterr().out


def written_log(path: Path, attrs: list[Attribution], clock_from: int = 0) -> Path:
    """A daemon's log of `attrs`, its lines from the `clock_from`th on with a `time` (an
    older version wrote none)."""
    with JsonLog(path) as log:
        for i, a in enumerate(attrs):
            wall = ClockRef(ts_ns=T0, realtime_ns=1_767_268_800 * 10**9)  # 2026-01-01 12:00
            log.clock = wall if i >= clock_from else None
            log.write(a)
    return path


def report_of(*argv: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["report", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_rotated_log_reads_from_its_oldest_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its start and clock came from the current file alone: `--from +0` left out the
    rotated files' gaps, and just after a rotation (the current file empty) the whole log
    had no wall clock."""
    attrs = list(attributions(8))
    whole = written_log(tmp_path / "whole.log", attrs)
    rotated = tmp_path / "attr.log"
    lines = whole.read_bytes().splitlines(keepends=True)
    Path(f"{rotated}.2").write_bytes(b"".join(lines[:4]))
    Path(f"{rotated}.1").write_bytes(b"".join(lines[4:]))
    rotated.write_bytes(b"")
    for argv in (["--from", "+0"], ["--to", "+150ms"], ["--from", "12:00:00"]):
        assert (
            report_of(*argv, str(rotated), capsys=capsys)[1:]
            == report_of(*argv, str(whole), capsys=capsys)[1:]
        )
    assert main(["report", "--json", "--to", "+150ms", str(rotated)]) == 0
    assert len(json.loads(capsys.readouterr().out)["attributions"]) == 4


def test_a_log_begun_by_an_older_version_takes_its_clock_from_its_later_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    attrs = list(attributions(6))
    older = written_log(tmp_path / "attr.log", attrs, clock_from=2)
    out = report_of("--from", "12:00:00", str(older), capsys=capsys)
    assert "gaps" in "\n".join(out) and not any("t=" in line for line in out)


def test_what_no_clock_holds_and_gaps_of_no_length_are_reported_not_crashed_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A made-up or damaged log: a line's time in the year 9999 (local time past the
    datetime's range), a gap of no length (its shares divided by 0), a last line without
    its newline (read: it is whole JSON). Each was an internal error, or a lost line."""
    attrs = list(attributions(4))
    attrs[1] = replace(attrs[1], end_ns=attrs[1].ts_ns, parts=())
    path = written_log(tmp_path / "attr.log", attrs)
    text = path.read_bytes()
    first_time = json.loads(text.splitlines()[0])["time"]
    path.write_bytes(text.replace(first_time.encode(), b"9999-12-31T23:59:59.999999Z", 1)[:-1])
    for argv in ([], ["--html", str(tmp_path / "r.html")], ["--from", "+0"]):
        assert main(["report", *argv, str(path)]) == 0, argv
    capsys.readouterr()
    assert main(["report", "--json", str(path)]) == 0
    assert len(json.loads(capsys.readouterr().out)["attributions"]) == 4


def test_what_the_disk_refused_the_log_is_said_and_unknown_kinds_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log.dropped line (the daemon's count of the attributions a full disk cost) and a
    newer version's kinds were skipped without a word: the report read as complete."""
    path = written_log(tmp_path / "attr.log", list(attributions(2)))
    lines = path.read_bytes().splitlines(keepends=True)
    dropped = {"schema": "gpujitter.attribution/1", "type": "log.dropped", "ts_ns": T0 + MS,
               "count": 1234, "since_ns": T0, "reason": "No space left on device"}  # fmt: skip
    newer = {"schema": "gpujitter.attribution/1", "type": "gpu.newkind", "ts_ns": T0}
    path.write_bytes(lines[0] + (json.dumps(dropped) + "\n" + json.dumps(newer) + "\n").encode()
                     + lines[1])  # fmt: skip
    out = report_of(str(path), capsys=capsys)
    assert any("1234 attributions the daemon could not write" in line for line in out), out
    assert any("1 records of kinds this version does not know" in line for line in out), out
    assert main(["report", "--json", str(path)]) == 0
    assert len(json.loads(capsys.readouterr().out)["attributions"]) == 2


def test_blank_lines_in_a_log_are_no_record_and_no_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Twelve blank lines before the first record (a file edited by hand) made it 'not a
    gpujitter recording'; fewer, or blank lines between records, were damage (trace exit 1),
    where an events file skipped them."""
    clean = written_log(tmp_path / "clean.log", list(attributions(4)))
    lines = clean.read_bytes().splitlines(keepends=True)
    blank = tmp_path / "blank.log"
    blank.write_bytes(b"\n" * 12 + lines[0] + b"\n  \n" + b"".join(lines[1:]) + b"\n")
    assert report_of(str(blank), capsys=capsys)[1:] == report_of(str(clean), capsys=capsys)[1:]
    assert main(["trace", str(blank)]) == 0
    assert "damage: none" in capsys.readouterr().out
